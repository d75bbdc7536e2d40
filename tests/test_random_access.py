"""shardkit.open: len, ds[i] in pile and epoch order, get(key), the stored index, torch DataLoaders."""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.dataset import index_file, layout
from shardkit.loading import index as index_module
from shardkit.tar.shard import Shard, read_shard
from tests.conftest import make_samples

N = 203


def _write(out: str, n: int = N, *, piles: int = 6, seed: int = 1, **options) -> str:
    with shardkit.PileWriter(out, piles=piles, seed=seed, **options) as w:
        for s in make_samples(n):
            w.write(s)
    return out


@pytest.fixture
def ds_dir(tmp_path) -> str:
    return _write(str(tmp_path / "ds"))


def _pile_order(out: str) -> list[str]:
    """Keys in pile order, read pile by pile without the index."""
    m = manifest.read(out)
    return [k for p in m.piles for k in Shard(p.name, read_shard(storage.join(out, p.name))).keys]


def test_pile_order_len_and_decoding_match_the_piles_and_the_loader(ds_dir):
    ds = shardkit.open(ds_dir, decode=False)
    assert len(ds) == N
    assert [ds[i]["__key__"] for i in range(N)] == _pile_order(ds_dir)
    assert ds[-1]["__key__"] == ds[N - 1]["__key__"]
    raw = {s["__key__"]: s for s in make_samples(N)}
    sample = ds[5]
    assert bytes(sample["bin"]) == raw[sample["__key__"]]["bin"]
    decoded = shardkit.open(ds_dir)[5]
    assert decoded["cls"] == raw[decoded["__key__"]]["cls"]
    mapped = shardkit.open(ds_dir, map=lambda s: (s["__key__"], s["cls"]))
    assert mapped[5] == (decoded["__key__"], decoded["cls"])


@pytest.mark.parametrize(("seed", "epoch", "mix"), [(0, 0, 1), (7, 3, 1), (2, 1, 3)])
def test_epoch_order_is_exactly_what_the_loader_yields_with_one_rank(ds_dir, seed, epoch, mix):
    loader = shardkit.loader(ds_dir, seed=seed, mix=mix, decode=False, world_size=1, rank=0)
    loader.set_epoch(epoch)
    expected = [s["__key__"] for s in loader]
    ds = shardkit.open(ds_dir, seed=seed, epoch=epoch, mix=mix, decode=False)
    assert [ds[i]["__key__"] for i in range(len(ds))] == expected
    ds.set_epoch(epoch + 1)
    loader.set_epoch(epoch + 1)
    assert [ds[i]["__key__"] for i in range(len(ds))] == [s["__key__"] for s in loader] != expected


def test_get_by_key_and_the_errors_name_len_key_and_dataset(ds_dir):
    ds = shardkit.open(ds_dir, decode=False)
    for key in ("s0000000", "s0000117", f"s{N - 1:07d}"):
        assert ds.get(key)["__key__"] == key and key in ds
    with pytest.raises(KeyError, match=rf"'nope': no sample has this key in {ds_dir}"):
        ds.get("nope")
    assert "nope" not in ds
    # a default, as Mapping.get takes one: returned for a missing key, not for a present one
    sentinel = object()
    assert ds.get("nope", None) is None and ds.get("nope", sentinel) is sentinel
    assert ds.get("s0000000", sentinel)["__key__"] == "s0000000"
    for bad in (N, -N - 1, 10**12):
        with pytest.raises(IndexError, match=rf"index {bad} is out of range for a dataset of len {N}"):
            ds[bad]
    with pytest.raises(TypeError, match="integers, not str"):
        ds["s0000000"]  # type: ignore[index]
    with pytest.raises(shardkit.ConfigError, match="seed"):
        shardkit.open(ds_dir, seed=-1)
    # an epoch or a mix orders nothing without a seed: refused rather than given pile order
    with pytest.raises(shardkit.ConfigError, match=r"epoch: 2 .*give seed= too"):
        shardkit.open(ds_dir, epoch=2)
    with pytest.raises(shardkit.ConfigError, match=r"mix: 2 .*give seed= too"):
        shardkit.open(ds_dir, mix=2)
    with pytest.raises(shardkit.DatasetNotFoundError):
        shardkit.open(os.path.join(ds_dir, "missing"))


def test_each_sample_is_one_ranged_read_of_its_own_bytes(ds_dir, monkeypatch):
    ds = shardkit.open(ds_dir, decode=False)
    assert len(ds.index) == N  # built: every pile read once
    reads: list[tuple[str, int, int]] = []
    real = storage.LocalStore.read_range

    def spy(store, name, start, end):
        reads.append((name, start, end))
        return real(store, name, start, end)

    monkeypatch.setattr(storage.LocalStore, "read_range", spy)
    monkeypatch.setattr(storage.LocalStore, "read", lambda *a, **k: pytest.fail("a whole file was read"))
    monkeypatch.setattr(storage.LocalStore, "read_whole", lambda *a, **k: pytest.fail("a whole file was mapped"))
    ds[17]
    ds.get("s0000042")
    # two members (.bin, .cls): a header and a block of data each
    assert len(reads) == 2 and all(end - start == 4 * 512 for _, start, end in reads)


def test_the_index_is_stored_once_and_a_stale_or_corrupt_one_is_rebuilt(tmp_path, monkeypatch, caplog):
    out = _write(str(tmp_path / "ds"))
    first = [s["__key__"] for s in shardkit.open(out, decode=False)]  # iteration by __getitem__ ends at IndexError
    url = os.path.join(out, layout.index_name(manifest.read(out).generation))
    assert os.path.exists(url) and layout.kind(os.path.basename(url)) == "index"
    stored = Path(url).read_bytes()

    builds = []
    real = index_module.build
    monkeypatch.setattr(index_module, "build", lambda *a, **k: builds.append(1) or real(*a, **k))
    assert [s["__key__"] for s in shardkit.open(out, decode=False)] == first and builds == []

    # a byte flipped anywhere, a torn file, another file: never trusted
    for damaged in (stored[:100] + bytes([stored[100] ^ 1]) + stored[101:], stored[:-9], b"not an index"):
        Path(url).write_bytes(damaged)
        with caplog.at_level(logging.WARNING):
            assert [s["__key__"] for s in shardkit.open(out, decode=False)] == first
        assert "rebuilding the index" in caplog.text
        caplog.clear()
    assert Path(url).read_bytes() == stored and len(builds) == 3

    # the dataset overwritten with other piles: the old index names another manifest
    _write(out, 50, piles=3, seed=9, overwrite=True)
    Path(url).write_bytes(stored)
    with caplog.at_level(logging.WARNING):
        again = shardkit.open(out, decode=False)
        assert sorted(again[i]["__key__"] for i in range(len(again))) == sorted(s["__key__"] for s in make_samples(50))
    assert "header manifest=" in caplog.text


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_compressed_piles_are_read_whole_and_kept_bounded(tmp_path, codec):
    plain = shardkit.open(_write(str(tmp_path / "plain")), decode=False)
    packed = shardkit.open(_write(str(tmp_path / codec), compression=codec), decode=False, keep_piles=2)
    assert [packed[i]["__key__"] for i in range(N)] == [plain[i]["__key__"] for i in range(N)]
    assert bytes(packed.get("s0000099")["bin"]) == bytes(plain.get("s0000099")["bin"])
    assert len(packed._piles) <= 2


def test_a_grown_dataset_is_read_through_its_segments(tmp_path):
    out = _write(str(tmp_path / "ds"), 60, piles=3)
    with shardkit.PileWriter(out, piles=3, seed=1, mode="append") as w:
        for i in range(40):
            w.write({"__key__": f"new{i:03d}", "bin": b"x" * i, "cls": 1})
    m = manifest.read(out)
    assert m.generation >= 1 and any(p.segments for p in m.piles)
    loader = shardkit.loader(out, shuffle=False, decode=False, world_size=1, rank=0)
    ds = shardkit.open(out, decode=False)
    assert [ds[i]["__key__"] for i in range(len(ds))] == [s["__key__"] for s in loader]
    assert os.path.exists(os.path.join(out, layout.index_name(m.generation)))
    assert ds.get("new007")["bin"] == b"x" * 7


def test_it_pickles_small_and_reads_the_same_after(ds_dir):
    ds = shardkit.open(ds_dir, seed=3, decode=False)
    ds[0]
    data = pickle.dumps(ds)
    assert len(data) < 2000
    copy = pickle.loads(data)
    assert [copy[i]["__key__"] for i in range(N)] == [ds[i]["__key__"] for i in range(N)]


def test_on_s3_a_sample_is_one_ranged_read(s3, monkeypatch):
    url = s3.url("ds")
    with shardkit.PileWriter(url, piles=4, seed=2) as w:
        for s in make_samples(80):
            w.write(s)
    ds = shardkit.open(url, decode=False)
    keys = [ds[i]["__key__"] for i in range(len(ds))]
    assert sorted(keys) == sorted(s["__key__"] for s in make_samples(80))
    assert storage.exists(storage.join(url, layout.index_name(manifest.read(url).generation)))
    for method in ("read", "read_whole"):
        real = getattr(storage.FsspecStore, method)

        def whole(store, name, real=real, **kw):
            assert "pile-" not in name, f"a whole pile was read: {store.url(name)}"
            return real(store, name, **kw)

        monkeypatch.setattr(storage.FsspecStore, method, whole)
    fresh = pickle.loads(pickle.dumps(ds))  # a worker: the manifest and the stored index, then one range a sample
    assert fresh.get(keys[5])["__key__"] == keys[5] and fresh[7]["__key__"] == keys[7]


# --- torch ------------------------------------------------------------------------------------


def test_torch_dataloader_with_workers_and_distributed_sampler(ds_dir):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")
    from torch.utils.data import DataLoader, DistributedSampler

    ds = shardkit.open(ds_dir, map=lambda s: s["__key__"])
    everything = sorted(s["__key__"] for s in make_samples(N))
    for workers in (0, 2):
        got = [k for batch in DataLoader(ds, batch_size=16, num_workers=workers, shuffle=True) for k in batch]
        assert sorted(got) == everything
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4, drop_last=False)
        sampler.set_epoch(1)
        loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
        seen.append([k for batch in loader for k in batch])
    assert len(seen[0]) == len(seen[1]) == -(-N // 2)
    assert set(seen[0]) | set(seen[1]) == set(everything)
    assert torch.utils.data.get_worker_info() is None


def _key(sample: dict) -> str:
    return sample["__key__"]


def _batch(items: list) -> list:
    return items


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_dataloader_workers(tmp_path, context):
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")
    from torch.utils.data import DataLoader

    out = _write(str(tmp_path / "ds"), 48, piles=4)
    ds = shardkit.open(out, seed=1, decode=False, map=_key)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context=context, collate_fn=_batch)
    for epoch in range(3):
        ds.set_epoch(epoch)  # in the main process: the workers hold copies made when they started
        assert [k for batch in loader for k in batch] == [ds[i] for i in range(len(ds))], epoch
    assert len(pickle.dumps(ds)) < 2000 and pickle.loads(pickle.dumps(ds)).epoch == 2


def test_the_one_key_hash_is_the_vectorized_one():
    import numpy as np

    from shardkit.loading.one_sample import key_hash
    from shardkit.tar.keys import key_hashes

    keys = ["", "a", "abcdefgh", "abcdefghi", "part-00003/row-000017", "é/ü" * 9, "x" * 200]
    assert [key_hash(k) for k in keys] == key_hashes(np.array([k.encode() for k in keys], dtype=bytes)).tolist()


def test_samples_with_pax_records_take_the_careful_path(tmp_path, monkeypatch):
    import tarfile

    from shardkit.loading import random_access

    src = tmp_path / "src.tar"
    with tarfile.open(src, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(30):
            for ext, data in (("txt", f"text {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"long/{'d' * 120}/k{i:03d}.{ext}")  # a name too long for ustar: a pax record
                info.size, info.mtime = len(data), 1.5
                tar.addfile(info, __import__("io").BytesIO(data))
    out = str(tmp_path / "ds")
    shardkit.pile([str(src)], out, piles=3, quiet=True)
    ds = shardkit.open(out)
    careful = []
    monkeypatch.setattr(random_access, "Shard", lambda *a, **k: careful.append(1) or Shard(*a, **k))
    got = {ds[i]["__key__"]: ds[i]["cls"] for i in range(len(ds))}
    assert careful
    assert got == {f"long/{'d' * 120}/k{i:03d}": i for i in range(30)}


def test_the_random_access_benchmark_runs_at_toy_size():
    import importlib.util
    import subprocess
    import sys

    for module, package in (("litdata", "litdata"), ("streaming", "mosaicml-streaming")):
        if importlib.util.find_spec(module) is None:  # streaming is not imported here: it needs the script's stand-in for torchvision
            pytest.skip(f"{package} is not installed (pip install 'shardkit[mds,litdata]')")

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    # Mosaic's StreamingDataset imports torchvision and transformers, which bench_read stands in for
    # where they cannot load; anything else that keeps it from importing here is named
    probe = subprocess.run(
        [sys.executable, "-c", "import bench_read; bench_read._import_streaming()[0].StreamingDataset"],
        capture_output=True,
        text=True,
        cwd=here,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"MosaicML's StreamingDataset does not import here: {probe.stderr.strip().splitlines()[-1]}")
    script = os.path.join(here, "random_access.py")
    args = ["--samples", "300", "--reads", "50", "--warmup", "5", "--repeats", "1"]
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "µs" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["shardkit.open", "mosaic StreamingDataset", "litdata StreamingDataset"]
    assert all(r.split("|")[4].strip().endswith("x") for r in rows)


def test_on_s3_with_a_cache_a_pile_is_read_once_into_it(s3, tmp_path):
    url = s3.url("ds")
    with shardkit.PileWriter(url, piles=2, seed=2) as w:
        for s in make_samples(40):
            w.write(s)
    cache = tmp_path / "cache"
    ds = shardkit.open(url, decode=False, cache_dir=str(cache))
    keys = sorted(ds[i]["__key__"] for i in range(len(ds)))
    assert keys == sorted(s["__key__"] for s in make_samples(40))
    copies = [n for _, _, names in os.walk(cache) for n in names if n.endswith(".tar")]
    assert sorted(n.split("-", 1)[1] for n in copies) == ["pile-000000.tar", "pile-000001.tar"]  # each pile copied once
    assert bytes(ds.get(keys[3])["bin"]) == next(s["bin"] for s in make_samples(40) if s["__key__"] == keys[3])


def test_a_pickled_dataset_reads_its_generation_after_an_append(tmp_path):
    """Its overwrite: test_a_pickled_dataset_refuses_another_dataset_written_over_it_at_its_generation."""
    out = _write(str(tmp_path / "ds"), 50, piles=4)
    ds = shardkit.open(out, decode=False)
    data = pickle.dumps(ds)  # as a DataLoader's workers get it
    with shardkit.PileWriter(out, piles=4, seed=1, mode="append") as w:
        w.write({"__key__": "new0", "bin": b"x", "cls": 1})
    assert [pickle.loads(data)[i]["__key__"] for i in range(50)] == [ds[i]["__key__"] for i in range(50)]


def test_a_pile_rewritten_under_the_index_is_an_error_naming_it(ds_dir):
    ds = shardkit.open(ds_dir, decode=False)
    f, start, _ = ds.index.locate(10)
    path = os.path.join(ds_dir, ds.index.files[f].name)
    data = bytearray(Path(path).read_bytes())
    data[start + 5] ^= 0x20  # a byte of the sample's first member name: the header checksum no longer holds
    Path(path).write_bytes(bytes(data))
    with pytest.raises(shardkit.CorruptShardError, match=r"pile-\d{6}\.tar"):
        ds[10]


def test_gc_collects_the_index_of_a_generation_it_collects(tmp_path):
    out = _write(str(tmp_path / "ds"), 50, piles=4)
    shardkit.open(out)[0]
    with shardkit.PileWriter(out, piles=4, seed=1, mode="append") as w:
        for i in range(10):
            w.write({"__key__": f"new{i}", "bin": b"x", "cls": 1})
    shardkit.open(out)[0]
    old, new = layout.index_name(0), layout.index_name(manifest.read(out).generation)
    assert {old, new} <= set(os.listdir(out))
    report = shardkit.gc(out, grace=0)
    assert old in report.deleted and old not in os.listdir(out) and new in os.listdir(out)


def test_a_pickled_dataset_refuses_another_dataset_written_over_it_at_its_generation(tmp_path):
    out = _write(str(tmp_path / "ds"), 40)
    ds = shardkit.open(out, decode=False)
    data = pickle.dumps(ds)
    with shardkit.PileWriter(out, piles=6, seed=1, overwrite=True) as w:  # generation 0 again, other samples
        for i in range(40):
            w.write({"__key__": f"other{i:03d}", "bin": b"y", "cls": 0})
    assert manifest.read(out).generation == ds.manifest.generation
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"generation 0, which this dataset was opened at, was overwritten") as e:
        pickle.loads(data)  # a DataLoader worker: not the samples the main process opened
    assert out in str(e.value)
    assert pickle.loads(pickle.dumps(shardkit.open(out, decode=False)))[0]["__key__"].startswith("other")


@pytest.mark.parametrize("indexed", [True, False])
def test_a_dataset_overwritten_while_open_says_so_naming_the_file(tmp_path, indexed):
    out = _write(str(tmp_path / "ds"), 40)
    ds = shardkit.open(out, decode=False)
    if indexed:
        assert len(ds.index) == 40
    with shardkit.PileWriter(out, piles=6, seed=1, overwrite=True) as w:
        for i in range(40):
            w.write({"__key__": f"other{i:03d}", "bin": b"y", "cls": 0})
    with pytest.raises(
        shardkit.DatasetNotFoundError, match=r"pile-000000\.tar.*was overwritten since it was opened; a new shardkit.open reads it"
    ):
        ds[0]
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"was overwritten since it was opened; a new shardkit.open reads it"):
        ds.get("s0000007")


def test_a_dataset_overwritten_and_grown_while_open_says_so_for_files_gone_and_files_of_other_bytes(tmp_path):
    out = str(tmp_path / "ds")

    def write(prefix: str, n: int, **options) -> None:
        with shardkit.PileWriter(out, piles=2, seed=0, **options) as w:
            for i in range(n):
                w.write({"__key__": f"{prefix}{i:04d}", "txt": prefix * 3})

    write("a", 50)
    write("x", 10, mode="append")
    ds = shardkit.open(out, decode=False)
    assert len(ds.index) == 60
    write("b", 50, overwrite=True)
    write("c", 10, mode="append")  # generation 1 again: its segments have the names of the one opened
    said = "was overwritten since it was opened; a new shardkit.open reads it"
    raised = set()
    for i in range(len(ds)):
        with pytest.raises((shardkit.DatasetNotFoundError, shardkit.CorruptShardError)) as e:
            ds.raw(i)
        assert said in str(e.value), str(e.value)
        raised.add(type(e.value))
    assert raised == {shardkit.DatasetNotFoundError, shardkit.CorruptShardError}  # both a file gone and one of other bytes


@pytest.mark.parametrize("harm", ["flip", "delete"])
def test_a_file_the_grown_dataset_still_lists_is_blamed_on_itself_not_on_the_dataset_moving_on(tmp_path, harm):
    out = _write(str(tmp_path / "ds"), 40, piles=2)
    ds = shardkit.open(out, decode=False)
    loader = iter(shardkit.loader(out, decode=False, seed=0, batch_size=2))
    with shardkit.PileWriter(out, piles=2, seed=1, mode="append") as w:
        for i in range(10):
            w.write({"__key__": f"new{i}", "bin": b"x", "cls": 1})
    shardkit.gc(out, grace=0)  # generation 0's manifest is collected; its whole piles are segments of generation 1
    path = os.path.join(out, "pile-000000.tar")
    if harm == "flip":
        data = bytearray(Path(path).read_bytes())
        data[600] ^= 0xFF
        Path(path).write_bytes(bytes(data))
    else:
        os.remove(path)
    said = "the bytes changed after writing" if harm == "flip" else "pile-000000.tar: no such file"
    for read in (lambda: [ds.raw(i) for i in range(len(ds))], lambda: list(loader)):
        with pytest.raises((shardkit.CorruptShardError, shardkit.DatasetNotFoundError)) as e:
            read()
        assert said in str(e.value) and "moved on" not in str(e.value) and "overwritten" not in str(e.value), str(e.value)


def test_a_generation_collected_while_open_says_so(tmp_path):
    out = _write(str(tmp_path / "ds"), 40, piles=3)
    ds = shardkit.open(out, decode=False)
    assert len(ds.index) == 40
    with shardkit.PileWriter(out, piles=3, seed=1, mode="append", window=1) as w:
        for i in range(10):
            w.write({"__key__": f"new{i}", "bin": b"x", "cls": 1})
    shardkit.gc(out, grace=0)
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"pile-000000\.tar.*moved on from generation 0, .* to 1"):
        ds[0]


def _store_index(out: str, data: bytes) -> str:
    path = os.path.join(out, layout.index_name(manifest.read(out).generation))
    Path(path).write_bytes(data)
    return path


@pytest.mark.parametrize("how", ["negative", "reversed", "past the end"])
def test_an_index_whose_checksums_hold_but_whose_bounds_are_wrong_is_an_error_naming_it(ds_dir, how):
    m = manifest.read(ds_dir)
    shardkit.open(ds_dir).index  # noqa: B018 (built and stored)
    entries = index_file.stored_entries(ds_dir, m)
    files = index_file.data_files(m)
    first = entries[files[0].name]
    bounds = first.bounds.copy()
    if how == "negative":
        bounds[0] = -512
    elif how == "reversed":
        bounds[0], bounds[1] = bounds[1], bounds[0]
    else:
        bounds[1] = 2**62  # a read of that many bytes would take the machine's memory
    runs = [index_file.Entries(bounds, first.hashes, first.crcs)] + [entries[f.name] for f in files[1:]]
    _store_index(ds_dir, index_file.encode(files, runs, m))  # a writer's bug: every checksum holds
    ds = shardkit.open(ds_dir, decode=False)
    with pytest.raises(shardkit.CorruptShardError, match=r"shardkit\.g000000\.idx: .*sample 0 of pile-000000\.tar"):
        ds[0]
    assert ds[len(ds) - 1]["__key__"] == _pile_order(ds_dir)[-1]  # the other files' entries are sound


def test_an_index_whose_checksums_hold_but_whose_key_positions_are_wrong_is_an_error_naming_it(ds_dir):
    m = manifest.read(ds_dir)
    shardkit.open(ds_dir).index  # noqa: B018 (built and stored)
    path = os.path.join(ds_dir, layout.index_name(m.generation))
    raw = bytearray(Path(path).read_bytes())
    _, at, _ = index_file.read_header(memoryview(bytes(raw)), path)
    files = len(index_file.data_files(m))
    order_at = at + 8 * (m.samples + files) + 8 * m.samples
    order = np.frombuffer(bytes(raw[order_at : order_at + 4 * m.samples]), "<u4") + 10**6
    raw[order_at : order_at + 4 * m.samples] = order.astype("<u4").tobytes()
    raw[-4:] = index_file.CRC.pack(manifest.checksum(bytes(raw[:-4])))
    _store_index(ds_dir, bytes(raw))
    ds = shardkit.open(ds_dir, decode=False)
    with pytest.raises(shardkit.CorruptShardError, match=r"shardkit\.g000000\.idx: .*position \d+, past its 203 samples"):
        ds.get("s0000007")


def test_a_pile_evicted_by_another_thread_between_its_lookup_and_its_use_is_still_served(tmp_path):
    out = _write(str(tmp_path / "ds"), 40, piles=2, compression="lz4")
    ds = shardkit.open(out, decode=False, keep_piles=1)  # two piles, one kept
    first, other = ds[0]["__key__"], ds[len(ds) - 1]["__key__"]  # pile 0 read, then pile 1: pile 1 is kept
    found = ds[len(ds) - 1]  # pile 1 again: a hit, its entry moved to the end
    assert found["__key__"] == other
    seen: list[str] = []

    def meanwhile(frame, event, arg):  # this thread only: as its lookup of pile 1 returns, another thread reads pile 0
        if event == "c_return" and getattr(arg, "__self__", None) is ds._piles and arg.__name__ == "get" and not seen:
            reader = threading.Thread(target=lambda: seen.append(ds[0]["__key__"]))
            reader.start()
            reader.join()

    sys.setprofile(meanwhile)
    try:
        again = ds[len(ds) - 1]["__key__"]  # pile 1 found, then evicted by the other thread before it is moved to the end
    finally:
        sys.setprofile(None)
    assert (again, seen) == (other, [first])
    assert len(ds._piles) == 1


def test_an_index_whose_key_positions_are_of_a_signed_type_is_rebuilt(ds_dir, caplog):
    m = manifest.read(ds_dir)
    shardkit.open(ds_dir).index  # noqa: B018 (built and stored)
    path = os.path.join(ds_dir, layout.index_name(m.generation))
    raw = Path(path).read_bytes()
    header, at, _ = index_file.read_header(memoryview(raw), path)
    order_at = at + 8 * (m.samples + len(header["files"])) + 8 * m.samples
    order = np.frombuffer(raw, "<u4", count=m.samples, offset=order_at).astype(np.int64) - m.samples  # counted from the end
    text = json.dumps({**header, "order": "<i4"}).encode()
    head = index_file.MAGIC + index_file.LEN.pack(len(text)) + text
    head += index_file.CRC.pack(manifest.checksum(head))
    head += b"\0" * (-len(head) % 8)
    body = head + raw[at:order_at] + order.astype("<i4").tobytes() + raw[order_at + 4 * m.samples : -4]
    _store_index(ds_dir, body + index_file.CRC.pack(manifest.checksum(body)))  # every checksum holds
    ds = shardkit.open(ds_dir, decode=False)
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        assert [ds[i]["__key__"] for i in range(len(ds))] == _pile_order(ds_dir)
    assert "rebuilding the index" in caplog.text and "'<i4'" in caplog.text


def test_raw_takes_pile_order_positions_as_ds_i_takes_indices(ds_dir):
    ds = shardkit.open(ds_dir, decode=False)
    assert ds.raw(-1)["__key__"] == ds.raw(N - 1)["__key__"] == _pile_order(ds_dir)[-1]
    for bad in (N, -N - 1, 10**6):
        with pytest.raises(IndexError, match=rf"{ds_dir}: index {bad} is out of range for a dataset of len {N}"):
            ds.raw(bad)
    with pytest.raises(TypeError, match=rf"{ds_dir}: sample indices must be integers, not str"):
        ds.raw("0")


def test_set_epoch_while_another_thread_reads_keeps_no_permutation_of_the_old_epoch(ds_dir, monkeypatch):
    """A thread that drew a pile's permutation of epoch 0 while another moved the dataset to
    epoch 1 must not leave it where epoch 1's reads find it: ds[i] would give another sample."""
    ds = shardkit.open(ds_dir, seed=3, decode=False)
    drawn = shardkit.loading.plan.EpochOrder.in_pile
    moved = []

    def in_pile(order, pile):
        if not moved:  # "another thread" moves the epoch and reads while this one draws
            moved.append(pile)
            ds.set_epoch(1)
            ds.position(0)
        return drawn(order, pile)

    monkeypatch.setattr(shardkit.loading.plan.EpochOrder, "in_pile", in_pile)
    ds.position(0)
    fresh = shardkit.open(ds_dir, seed=3, epoch=1, decode=False)
    assert [ds.position(i) for i in range(len(ds))] == [fresh.position(i) for i in range(len(fresh))]


def test_its_manifest_is_serialized_once_however_often_it_is_pickled(ds_dir, monkeypatch):
    """A DataLoader spawning its workers pickles the dataset once a worker and an epoch: the
    manifest's identity (its whole JSON, 0.1 s at 20000 piles) is computed once, not each time."""
    from shardkit.loading import random_access

    ds = shardkit.open(ds_dir, seed=0, decode=False)
    calls = []
    real = random_access.identity
    monkeypatch.setattr(random_access, "identity", lambda m: calls.append(m) or real(m))
    for _ in range(3):
        pickle.dumps(ds)
    assert len(calls) == 1
    copy = pickle.loads(pickle.dumps(ds))  # a worker checks what it found once, and pickles on from that
    pickle.dumps(copy)
    assert len(calls) == 2


def test_a_file_missing_from_a_kept_generation_is_not_said_to_be_collected(tmp_path):
    """The dataset moved on, but generation 0's manifest is kept and lists the file: one file went
    missing (damage), and an error blaming an overwrite or gc would send its reader the wrong way."""
    out = _write(str(tmp_path / "ds"), 40, piles=3)
    ds = shardkit.open(out, decode=False)
    assert len(ds.index) == 40
    with shardkit.PileWriter(out, piles=3, seed=1, mode="append") as w:
        for i in range(10):
            w.write({"__key__": f"new{i}", "bin": b"x", "cls": 1})
    os.remove(os.path.join(out, "pile-000000.tar"))
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"pile-000000\.tar") as e:
        ds[0]
    assert "moved on" not in str(e.value) and "gc" not in str(e.value)


def test_an_epoch_past_what_states_name_is_refused_by_every_front_door(tmp_path):
    """Epochs travel to DataLoader workers as signed 64-bit integers (2**63 would wrap negative,
    2**64 read epoch 0's order), and a state names at most 2**40 (the epoch after the last read):
    each front door refuses an epoch past 2**40 - 1 by name, and the last one's end state loads."""
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=2, seed=0) as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "txt": "x"})
    ds = shardkit.open(out, seed=0)
    ds.set_epoch(2**40 - 1)
    assert ds.epoch == 2**40 - 1
    for call in (
        lambda: ds.set_epoch(2**40),
        lambda: shardkit.open(out, seed=0, epoch=2**64),
        lambda: shardkit.loader(out).set_epoch(2**63),
    ):
        with pytest.raises(shardkit.ConfigError, match=r"epoch: expected an integer between 0 and 1099511627775, got \d+"):
            call()
    last = shardkit.loader(out, seed=0)
    last.set_epoch(2**40 - 1)
    assert len(list(last)) == 8
    shardkit.loader(out, seed=0).load_state_dict(last.state_dict())  # names epoch 2**40: loads
