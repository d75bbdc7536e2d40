"""Random access to a pile dataset: ``len(ds)``, ``ds[i]`` and ``ds.get(key)``, each reading one sample's bytes.

:func:`open` gives a map-style dataset. Position ``i`` counts in pile order (manifest order,
each pile in file order), or, with ``seed``, in the order ``shardkit.loader(DATASET, seed=seed)``
yields in epoch ``epoch`` on one rank. The index that says where each sample lies
(:mod:`shardkit.loading.index`) is built on first use and stored beside the manifest. A data
file that cannot be read then (missing, corrupt) is remembered with its error: its samples
raise that error, the others are served, and the index is not stored until every file reads.

A plain pile is read by range: one ``pread`` locally, one ranged GET on an object store. A
compressed pile (``.tar.lz4``, ``.tar.zst``, ``.tar.gz``) cannot be read by range, so it is read whole,
checked, decompressed and kept: the ``keep_piles`` most recently used piles stay in memory. With
``cache_dir`` a remote pile is read whole once into the local cache, and samples come from
that copy.

    ds = shardkit.open("data/train")
    ds[17]["cls"], ds.get("part-00003/row-000017")
    ds = shardkit.open("data/train", seed=0, epoch=2)   # the loader's order in epoch 2
"""

from __future__ import annotations

import collections
import operator
import os
from collections.abc import Callable, Mapping
from multiprocessing import context as mp_context
from multiprocessing.sharedctypes import RawArray
from typing import Any

import numpy as np

from shardkit import manifest, storage
from shardkit._util import check_bool, check_int, check_path
from shardkit.codecs import Codecs
from shardkit.dataset.transaction import Dataset
from shardkit.errors import ConfigError, CorruptShardError, DatasetNotFoundError
from shardkit.loading import plan
from shardkit.loading.decode import Transform
from shardkit.loading.index import Index, identity, load_or_build
from shardkit.loading.one_generation import manifest_of_first
from shardkit.loading.one_sample import parse
from shardkit.loading.options import LoaderOptions
from shardkit.loading.pile import fetch
from shardkit.loading.source import why_gone
from shardkit.manifest import PileInfo
from shardkit.tar.shard import Shard
from shardkit.tar.write import TRAILER

# in-pile permutations kept for epoch order (each costs one draw of a pile's size)
_PERMUTATIONS = 8
# get()'s default when none is given, then a missing key is a KeyError: not None, which a caller may pass
_MISSING: Any = object()


class MapDataset:
    """A pile dataset as a sequence of samples; see :func:`open`.

    It pickles as its options alone (a few hundred bytes): each process that unpickles it
    (a torch ``DataLoader`` worker) loads the stored index on first use, memory-mapped for a
    local dataset, so the workers share its pages.

    Threads may share it: ``ds[i]`` from several at once reads each sample as one would.

    A data file (a pile, or a segment of a grown one) that cannot be read when the index is
    built is logged once, as a warning naming it; ``ds[i]`` of a sample in it raises what
    reading it raised, each time, without reading it again; every other sample is served. A
    position cannot be skipped, so ``options.on_error`` (the loader's) changes none of this.

    Example:
        ds = shardkit.open("data/train", decode=False)
        len(ds), ds[0]["__key__"], ds.get(ds[0]["__key__"])
    """

    def __init__(
        self,
        root: str,
        *,
        seed: int | None,
        epoch: int,
        mix: int,
        options: LoaderOptions,
        keep_piles: int,
        one_generation: bool = True,
    ) -> None:
        self.root, self.seed, self.mix = root, seed, mix
        self.options, self.keep_piles = options, keep_piles
        self._epoch = _epoch_cell(seed, epoch)
        storage.use(self.root, self.options.storage_options)
        found = manifest.read(self.root)
        self._setup(manifest_of_first(self.root, found) if one_generation else found)  # the ranks of a job: one generation

    def _setup(self, found: manifest.Manifest, *, identified: str | None = None) -> None:
        self.manifest = found
        self._identity = identified  # the manifest's, computed on the first pickle (its whole JSON: 0.1 s at 20000 piles)
        self._counts = [p.samples for p in self.manifest.piles]
        self._pile_starts = np.concatenate([[0], np.cumsum(self._counts)]).astype(np.int64)
        self._index: Index | None = None
        self._transform = Transform(self.options.codecs(), self.options.map)
        # (epoch, its order, its in-pile permutations kept): one value, read once per position
        self._ordered: tuple[int, plan.EpochOrder, collections.OrderedDict[int, np.ndarray]] | None = None
        self._piles: collections.OrderedDict[int, storage.Buffer] = collections.OrderedDict()
        self._reads: storage.RemoteReads | None = None
        self._urls: list[str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("root", "seed", "mix", "options", "keep_piles")
        if self._identity is None:  # once: a DataLoader spawning its workers pickles it once a worker and an epoch
            self._identity = identity(self.manifest)
        pinned = {"generation": self.manifest.generation, "manifest": self._identity, "epoch": self.epoch}
        if mp_context.get_spawning_popen() is not None and not isinstance(self._epoch, list):
            pinned["epoch_cell"] = self._epoch  # a worker being started: it shares the main process's epoch
        return {**{k: self.__dict__[k] for k in keep}, **pinned}

    def __setstate__(self, state: dict[str, Any]) -> None:
        generation, expected = state.pop("generation"), state.pop("manifest", None)
        epoch, cell = state.pop("epoch"), state.pop("epoch_cell", None)
        self.__dict__.update(state)
        self._epoch = cell if cell is not None else _epoch_cell(self.seed, epoch)
        storage.use(self.root, self.options.storage_options)
        # the generation the pickled dataset read, whatever the latest is now: every worker reads the same samples
        found = Dataset(self.root).pinned(generation)
        identified = identity(found) if expected is not None else None
        if identified != expected:
            # an overwrite numbers its dataset from generation 0 again: the number alone would hand a worker other samples
            raise DatasetNotFoundError(
                f"{self.root}: generation {generation}, which this dataset was opened at, was overwritten since: its manifest "
                f"now lists another dataset ({len(found.piles)} piles, {found.samples} samples); shardkit.open it again to read that one"
            )
        self._setup(found, identified=identified)

    # -- the index and the order ---------------------------------------------------------------
    @property
    def index(self) -> Index:
        """The random-access index (loaded, or built and stored, on first use; built once with
        holes, see :attr:`Index.failed`, when a file cannot be read)."""
        if self._index is None:
            self._index = load_or_build(self.root, self.manifest, reads=self._remote())
        return self._index

    def _remote(self) -> storage.RemoteReads:
        if self._reads is None:
            cache = None
            if self.options.cache_dir is not None:
                from shardkit.storage.cache import PileCache

                cache = PileCache(self.options.cache_dir, self.options.cache_limit)
            self._reads = storage.RemoteReads(concurrency=self.options.remote_concurrency, cache=cache)
        return self._reads

    @property
    def epoch(self) -> int:
        """The epoch whose order positions count in (with a ``seed``)."""
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Count positions in the order of epoch ``epoch`` (with a ``seed``). The DataLoader
        workers this dataset was handed to, persistent ones too, count in it from their next read."""
        self._epoch[0] = plan.check_epoch(epoch)

    def __len__(self) -> int:
        return int(self._pile_starts[-1])

    def _checked(self, i: int) -> int:
        """``i`` as a position in ``range(len(self))``, negative ones counted from the end.

        Raises:
            TypeError: not an integer; IndexError: out of range (each naming the dataset).
        """
        n = len(self)
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"{self.root}: sample indices must be integers, not {type(i).__name__}") from None
        if not -n <= i < n:
            raise IndexError(f"{self.root}: index {i} is out of range for a dataset of len {n}")
        return i % n

    def position(self, i: int) -> int:
        """The pile-order position of the sample at position ``i`` of this dataset's order."""
        i = self._checked(i)
        if self.seed is None:
            return i
        _, order, perms = self._ordering(self.seed, self.epoch)
        if self.mix == 1:  # piles follow each other: the pile, then its permutation (kept for its neighbours)
            j = int(np.searchsorted(order._bounds, i, side="right")) - 1
            pile = int(order._read[j])
            perm = perms.get(pile)
            if perm is None:
                perm = order.in_pile(pile)
                _keep(perms, pile, perm, _PERMUTATIONS)
            return int(self._pile_starts[pile]) + int(perm[i - int(order._bounds[j])])
        piles, within = order.take(i, i + 1)
        return int(self._pile_starts[int(piles[0])]) + int(within[0])

    def _ordering(self, seed: int, epoch: int) -> tuple[int, plan.EpochOrder, collections.OrderedDict[int, np.ndarray]]:
        """Epoch ``epoch``'s order and the permutations kept for it, as one value: a thread that
        drew a permutation of the epoch before another moved the dataset on puts it in that
        epoch's cache, where no read of the new epoch finds it (separate attributes mixed them)."""
        ordered = self._ordered
        if ordered is None or ordered[0] != epoch:
            order = plan.EpochOrder(self._counts, seed=seed, epoch=epoch, mix=self.mix)
            ordered = self._ordered = (epoch, order, collections.OrderedDict())
        return ordered

    # -- reading -------------------------------------------------------------------------------
    def raw(self, position: int) -> dict[str, Any]:
        """The sample at pile-order ``position`` as a dict of raw bytes (``__key__`` included);
        negative positions count from the end, as ``ds[i]``'s indices do."""
        return self._read(self._checked(position))[0]

    def _read(self, position: int) -> tuple[dict[str, Any], str]:
        """The raw sample at pile-order ``position``, and the URL of the file it is in."""
        try:
            return self._read_at(position)
        except (DatasetNotFoundError, CorruptShardError) as e:
            built = self._index  # None: the index itself could not be made, no file is known
            why = self._why_gone(None if built is None else built.files[built.file_at(position)].info)
            if why is None:
                raise
            raise type(e)(f"{e}: {why}") from e

    def _why_gone(self, file: PileInfo | None = None) -> str | None:
        """Why a file of the opened generation (``file``, where known) is missing or holds other
        bytes, when the manifest there says why (an overwrite, a generation collected): "no such
        file" alone reads like a damaged dataset."""
        listed = {p.name: p.checksum for p in self.manifest.piles}
        return why_gone(
            self.root,
            self.manifest.generation,
            listed,
            files=None if file is None else [file],
            since="it was opened",
            reader="this dataset",
            anew="a new shardkit.open",
        )

    def _read_at(self, position: int) -> tuple[dict[str, Any], str]:
        idx = self.index
        f, start, end = idx.locate(position)
        part = idx.files[f]
        if self._urls is None:
            self._urls = [storage.join(self.root, p.name) for p in idx.files]
        url = self._urls[f]
        store, name = storage.locate(url, reads=self._remote())
        if part.info.compression is None and not store.caches_reads:  # a cached pile is read whole, once
            data = store.read_range(name, start, end)
        else:
            data = bytes(self._whole(f, url)[start:end])
        if len(data) != end - start:
            raise CorruptShardError(f"{url}: sample at offset {start} ends past the file ({len(data)} of {end - start} bytes read)")
        if self.options.verify and idx.crcs is not None and manifest.checksum(data) != int(idx.crcs[position]):
            raise CorruptShardError(f"{url}: the sample at offset {start} does not match its checksum in the index: the file changed")
        sample = parse(data)
        if sample is None:  # pax or long-name records, or damage: the careful reader says which
            shard = Shard(url, data + TRAILER)
            if len(shard) != 1:
                raise CorruptShardError(f"{url}: bytes {start}..{end} hold {len(shard)} samples, the index says one: the file changed")
            sample = shard.sample(0)
        if position not in idx.lookup(sample["__key__"]):
            raise CorruptShardError(f"{url}: the sample at offset {start} has key {sample['__key__']!r}, not the indexed one")
        return sample, url

    def _whole(self, f: int, url: str) -> storage.Buffer:
        """The tar of data file ``f``, read whole and kept among the ``keep_piles`` most recently used."""
        held = self._piles.get(f)
        if held is None:
            part = self.index.files[f]
            held = fetch(url, expected=part.info, verify=self.options.verify, reads=self._remote()).buf
        _keep(self._piles, f, held, self.keep_piles)
        return held

    def __getitem__(self, i: int) -> Any:
        return self._transform(*self._read(self.position(i)))

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The sample whose key is ``key``, decoded like ``ds[i]``; ``default`` when given and
        no sample has that key (``ds.get(key, None)``, as ``Mapping.get``).

        When a data file could not be read, a key found in the files that were read is
        returned, but a key found in none of them is not reported missing, ``default`` or
        not: it may be in the unreadable file, and a caller told "absent" would act on a
        falsehood (drop the sample, write it again). As a key-value store fails a read it
        cannot answer, the file's error is raised; ``key in ds`` raises it too.

        Raises:
            KeyError: no sample of the dataset has that key and no ``default`` was given (the
                message names it and the dataset).
            CorruptShardError, ManifestError, DatasetNotFoundError: the key is in none of the
                files read and a file could not be read (named, with what was wrong with it).
        """
        found = self._find(key)
        if found is not None:
            return self._transform(*found)
        if default is not _MISSING:
            return default
        raise KeyError(f"{key!r}: no sample has this key in {self.root} ({len(self)} samples, generation {self.manifest.generation})")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not None

    def _find(self, key: str) -> tuple[dict[str, Any], str] | None:
        """The raw sample whose key is ``key`` and the URL of its file; None when no sample has it.
        Raises the error of an unreadable file when the key is in none of the files read."""
        if not isinstance(key, str):
            raise TypeError(f"{self.root}: keys are str, not {type(key).__name__}")
        idx = self.index
        for position in idx.lookup(key):
            sample, url = self._read(position)
            if sample["__key__"] == key:
                return sample, url
        if idx.failed:
            first, others = min(idx.failed), len(idx.failed) - 1
            elsewhere = f", or in one of the {others} other files that could not be read" if others else ""
            error = idx.unreadable(first, f"key {key!r} is in none of the files read, and may be in this one{elsewhere}")
            why = self._why_gone() if isinstance(error, DatasetNotFoundError) else None
            raise error if why is None else DatasetNotFoundError(f"{error}: {why}")
        return None

    def __repr__(self) -> str:
        order = "pile order" if self.seed is None else f"epoch {self.epoch} of seed {self.seed}"
        return f"<MapDataset {self.root}: {len(self)} samples in {len(self._counts)} piles, {order}>"


def _epoch_cell(seed: int | None, epoch: int) -> Any:
    """Where a dataset keeps its epoch: with a ``seed``, in memory shared with the DataLoader
    workers it is handed to (forked, or spawned: see ``__getstate__``), since persistent workers
    keep the copy they started with and ``set_epoch`` in the main process must reach them;
    without one the epoch orders nothing, and a list will do."""
    return [epoch] if seed is None else RawArray("q", [epoch])


def _keep(kept: collections.OrderedDict[int, Any], key: int, value: Any, most: int) -> None:
    """Put ``value`` last in ``kept``, dropping the oldest entries past ``most``. Threads share a
    dataset's caches: another may have dropped ``key`` or emptied ``kept`` since this one looked,
    so nothing here assumes an entry is still there (no ``move_to_end``, no ``popitem`` unguarded)."""
    kept.pop(key, None)  # then set: the entry goes last whether or not it is still there
    kept[key] = value
    while len(kept) > most:
        try:
            kept.popitem(last=False)
        except KeyError:  # emptied by another thread meanwhile
            break


def open(
    dataset: str | os.PathLike[str],
    *,
    seed: int | None = None,
    epoch: int = 0,
    mix: int = 1,
    decode: bool | str | Codecs = True,
    map: Callable[[dict[str, Any]], Any] | None = None,
    allow_pickle: bool = False,
    verify: bool = True,
    keep_piles: int = 2,
    remote_concurrency: int = storage.remote.DEFAULT_CONCURRENCY,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    one_generation: bool = True,
) -> MapDataset:
    """A shardkit dataset as a map-style dataset: ``len(ds)``, ``ds[i]``, ``ds.get(key)``.

    Args:
        dataset: a dataset directory (local or ``s3://``...) holding ``shardkit.json``.
        seed: None: ``ds[i]`` counts in pile order (the manifest's piles one after the other,
            each in file order). An int: in the order ``shardkit.loader(dataset, seed=seed,
            mix=mix)`` yields in epoch ``epoch`` with one rank.
        epoch, mix: the epoch (see :meth:`MapDataset.set_epoch`) and the loader's ``mix``; each
            needs a ``seed``.
        decode, map, allow_pickle: as for :func:`shardkit.loader`; ``decode=False`` gives raw bytes.
        verify: check each sample read by range against its CRC-32 in the index (an index of
            the first version has none), and a compressed pile read whole against the manifest's checksum.
        keep_piles: compressed piles (or cached remote piles) kept in memory, decompressed.
        remote_concurrency, cache_dir, cache_limit, storage_options: as for :func:`shardkit.loader`.
        one_generation: under an initialized torch.distributed of several processes, read the
            generation the first rank to open this dataset read (each rank's k-th open pairs with
            the others' k-th), so the ranks' samplers see one length; False reads the latest and
            asks nobody (a dataset one rank opens alone).

    Raises:
        ConfigError: an option is invalid; DatasetNotFoundError: no dataset there;
        ManifestError: the manifest is invalid.
    """
    root = check_path("dataset", dataset)
    check_int("seed", seed, low=0, none=True)
    plan.check_epoch(epoch)
    check_int("mix", mix, low=1)
    check_int("keep_piles", keep_piles, low=1)
    check_bool("one_generation", one_generation)
    if seed is None:
        for name, value, default in (("epoch", epoch, 0), ("mix", mix, 1)):
            if value != default:
                raise ConfigError(
                    f"{name}: {value} orders only the loader's shuffle, and without a seed ds[i] counts in pile order: give seed= too"
                )
    if map is not None and not callable(map):
        raise ConfigError(f"map: expected a function, got {type(map).__name__}")
    options = LoaderOptions(
        decode=decode,
        map=map,
        allow_pickle=allow_pickle,
        verify=verify,
        remote_concurrency=remote_concurrency,
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        cache_limit=cache_limit,
        storage_options=storage_options,
    )
    return MapDataset(root, seed=seed, epoch=epoch, mix=mix, options=options, keep_piles=keep_piles, one_generation=one_generation)
