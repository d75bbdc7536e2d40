"""The eager shuffle: a permutation of the input, readable by webdataset, uniform, and clean on failure."""

from __future__ import annotations

import io
import itertools
import os
import tarfile

import numpy as np
import pytest
import reference_tar
import webdataset as wds
from conftest import make_samples
from scipy import stats

import shardkit
from shardkit import eager_shuffle as shuffle_mod
from shardkit import manifest, shard_roller
from shardkit.cli import main
from shardkit.eager_shuffle import ShuffleOptions, shuffle
from shardkit.loading import plan
from shardkit.loading.pile import fetch, read_pile
from shardkit.shard_roller import ShardRoller
from shardkit.tar import walk as tarwalk
from shardkit.tar import write as tarwrite


def _write_inputs(directory, samples, shards: int) -> str:
    """Write samples in order into ``shards`` webdataset shards; returns a brace pattern."""
    os.makedirs(directory, exist_ok=True)
    per = -(-len(samples) // shards)
    for k in range(shards):
        with wds.TarWriter(os.path.join(directory, f"in-{k:03d}.tar")) as w:
            for s in samples[k * per : (k + 1) * per]:
                w.write(s)
    return os.path.join(directory, f"in-{{000..{shards - 1:03d}}}.tar")


def _read_wds(out: str) -> list[dict]:
    urls = [os.path.join(out, p.name) for p in manifest.read(out).piles]
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def _as_set(samples) -> set:
    return {(s["__key__"], bytes(s["bin"]), int(s["cls"])) for s in samples}


@pytest.fixture
def inputs(tmp_path):
    return _write_inputs(tmp_path / "in", make_samples(300), shards=4)


def test_output_is_a_permutation_readable_by_webdataset(tmp_path, inputs):
    out = str(tmp_path / "out")
    m = shuffle(inputs, out, piles=5, maxcount=64, quiet=True)
    got = _read_wds(out)
    assert len(got) == 300 == m.samples
    assert _as_set(got) == _as_set(make_samples(300))
    assert [s["__key__"] for s in got] != sorted(s["__key__"] for s in got)
    assert m.extra["kind"] == "shuffled" and m.extra["piles"] == 5
    assert sorted(os.listdir(out)) == sorted([p.name for p in m.piles] + ["shardkit.json"])
    assert shardkit.verify(out, quiet=True) == []
    summary = shardkit.info(out)
    assert (summary.kind, summary.samples, summary.piles) == ("shuffled", 300, len(m.piles))


def test_maxcount_rolls_over_across_pile_boundaries(tmp_path, inputs):
    m = shuffle(inputs, tmp_path / "out", piles=7, maxcount=64, quiet=True)
    assert [p.samples for p in m.piles] == [64, 64, 64, 64, 44]
    assert [p.name for p in m.piles] == [f"shard-{i:06d}.tar" for i in range(5)]


def test_maxsize_bounds_every_shard_and_each_ends_with_a_trailer(tmp_path, inputs):
    out = tmp_path / "out"
    m = shuffle(inputs, out, piles=3, maxsize="20KiB", quiet=True)
    assert len(m.piles) > 3
    for p in m.piles:
        path = out / p.name
        assert os.path.getsize(path) == p.bytes <= 20 * 1024
        assert path.read_bytes()[-1024:] == bytes(1024)
        with tarfile.open(path) as t:
            assert len(t.getnames()) == 2 * p.samples


def test_a_sample_over_maxsize_gets_a_shard_of_its_own(tmp_path):
    samples = make_samples(6, size=100)
    samples[2]["bin"] = bytes(10_000)
    m = shuffle(_write_inputs(tmp_path / "in", samples, 1), tmp_path / "out", piles=1, maxsize=8192, quiet=True)
    big = [p for p in m.piles if p.bytes > 8192]
    assert len(big) == 1 and big[0].samples == 1
    assert sum(p.samples for p in m.piles) == 6


@pytest.mark.parametrize(
    ("maxsize", "counts", "sizes"),
    [
        (4096, [2, 2, 1, 1, 1], [4096, 3072, 3072, 5120, 2048]),  # shards 0, 1 and 2 end exactly at maxsize
        (4095, [1, 1, 2, 1, 1, 1], [2048, 3072, 3072, 3072, 5120, 2048]),  # one byte less: each fills up earlier
    ],
)
def test_roller_cuts_at_maxsize_to_the_byte_across_piles(tmp_path, caplog, maxsize, counts, sizes):
    data = [512, 1536, 512, 512, 1536, 3584, 512]  # members of 1, 2, 1, 1, 2, 4 and 1 KiB
    buf = b"".join(tarwrite.member(f"k{i}.bin", bytes([i]) * n) for i, n in enumerate(data))
    bounds = np.cumsum([0] + [n + 512 for n in data])
    roller = ShardRoller(str(tmp_path), maxcount=None, maxsize=maxsize)
    roller.extend(buf, bounds[:3], bounds[1:4])  # one pile's samples, then the next pile's
    roller.extend(buf, bounds[3:-1], bounds[4:])
    shards = roller.close()
    assert [s.samples for s in shards] == counts and [s.bytes for s in shards] == sizes
    assert b"".join((tmp_path / s.name).read_bytes()[:-1024] for s in shards) == buf
    assert "one sample of 4096 bytes is over maxsize" in caplog.text


def test_deterministic_for_a_seed(tmp_path, inputs):
    def run(name: str, seed: int, workers: int = 1) -> list[bytes]:
        m = shuffle(inputs, tmp_path / name, piles=4, maxcount=50, seed=seed, workers=workers, quiet=True)
        return [(tmp_path / name / p.name).read_bytes() for p in m.piles]

    first = run("a", 1)
    assert run("b", 1, workers=2) == first  # pass 1 routes by (seed, input, ordinal): workers do not matter
    assert run("c", 2) != first


def _reference_shards(piles_dir: str, seed: int, maxcount: int | None, maxsize: int | None) -> list[bytes]:
    """What shuffle must write, made the plain way: the loader's epoch-0 order over the piles,
    each sample's bytes copied one at a time into shards cut at the limits."""
    m = manifest.read(piles_dir)
    order = plan.EpochOrder([p.samples for p in m.piles], seed=seed, epoch=0)
    shards, current, count = [], b"", 0
    for index in order.pile_order.tolist():
        pile = read_pile(os.path.join(piles_dir, m.piles[index].name))
        members = tarwalk.walk(pile.buf, pile.url)
        spans = reference_tar.sample_spans(members, reference_tar.group(members, pile.url)[1])
        for i in order.in_pile(index).tolist():
            data = bytes(pile.buf[spans[i] : spans[i + 1]])
            full = (maxcount is not None and count >= maxcount) or (maxsize is not None and len(current) + len(data) + 1024 > maxsize)
            if count and full:
                shards.append(current + bytes(1024))
                current, count = b"", 0
            current, count = current + data, count + 1
    return [*shards, current + bytes(1024)]


def _mixed_samples(n: int) -> list[dict]:
    """Samples of 0-3000 bytes, some with names too long for a ustar header, one of 12 KB."""
    rng = np.random.default_rng(5)
    samples = []
    for i in range(n):
        key = f"deep/{'x' * 110}{i:04d}" if i in (4, 50) else f"k{i:04d}"
        samples.append({"__key__": key, "bin": rng.bytes(12_000 if i == 17 else int(rng.integers(0, 3000))), "cls": i % 3})
    return samples


@pytest.mark.parametrize(
    ("n", "piles", "maxcount", "maxsize"),
    [(120, 5, 7, None), (120, 4, None, 6144), (120, 3, 5, 9000), (120, 1, None, None), (3, 6, 2, None), (0, 2, None, None)],
)
def test_output_is_byte_identical_to_copying_sample_by_sample(tmp_path, monkeypatch, n, piles, maxcount, maxsize):
    monkeypatch.setattr(shardkit.storage.local, "MAP_MIN", 0)  # piles memory-mapped, as real ones are
    inputs = _write_inputs(tmp_path / "in", _mixed_samples(n), shards=2)
    m = shuffle(inputs, tmp_path / "out", piles=piles, maxcount=maxcount, maxsize=maxsize, seed=11, quiet=True)
    shardkit.pile(inputs, str(tmp_path / "piles"), piles=piles, seed=11, quiet=True)  # pass 1 alone, as shuffle runs it
    limits = ShuffleOptions(maxcount=maxcount, maxsize=maxsize).limits()
    expected = _reference_shards(str(tmp_path / "piles"), 11, *limits)
    assert [(tmp_path / "out" / p.name).read_bytes() for p in m.piles] == expected
    assert [p.samples for p in m.piles] == [
        len(list(wds.WebDataset(str(tmp_path / "out" / p.name), shardshuffle=False, empty_check=False))) for p in m.piles
    ]
    assert shardkit.verify(str(tmp_path / "out"), quiet=True) == []


def test_relative_orders_are_uniform(tmp_path):
    """Chi-square over the 120 orders of 5 samples.

    In a uniform permutation the relative orders of disjoint groups are independent and each
    uniform over 5! orders; groups of 5 *adjacent* input samples are the hardest case for a
    shuffle that leaks input order. 3 seeds x 400 groups = 1200 draws, 10 per order expected.
    """
    n, size = 2000, 5
    samples = [{"__key__": f"k{i:05d}", "txt": ""} for i in range(n)]
    inputs = _write_inputs(tmp_path / "in", samples, 3)
    index = {order: i for i, order in enumerate(itertools.permutations(range(size)))}
    counts = np.zeros(len(index), dtype=int)
    for seed in range(3):
        shuffle(inputs, tmp_path / "out", piles=6, maxcount=300, seed=seed, overwrite=True, quiet=True)
        position = {s["__key__"]: pos for pos, s in enumerate(_read_wds(str(tmp_path / "out")))}
        ranks = np.array([position[f"k{i:05d}"] for i in range(n)]).reshape(-1, size)
        for group in np.argsort(ranks, axis=1):
            counts[index[tuple(group.tolist())]] += 1
    assert counts.sum() == 3 * n // size
    assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("interrupt", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failure_in_pass_2_leaves_the_old_dataset_and_no_temp_dir(tmp_path, inputs, monkeypatch, interrupt):
    out = tmp_path / "out"
    before = shuffle(inputs, out, piles=3, maxcount=100, quiet=True)
    calls = []

    def failing(url, **kwargs):
        calls.append(url)
        if len(calls) == 2:
            raise interrupt
        return fetch(url, **kwargs)

    monkeypatch.setattr(shuffle_mod, "fetch", failing)
    with pytest.raises(type(interrupt)):
        shuffle(inputs, out, piles=3, maxcount=64, seed=9, overwrite=True, quiet=True)
    assert manifest.read(str(out)) == before
    assert sorted(os.listdir(out)) == sorted([p.name for p in before.piles] + ["shardkit.json"])
    assert shardkit.verify(str(out), quiet=True) == []


def test_a_write_error_while_a_pile_is_mapped_surfaces_as_itself(tmp_path, inputs, monkeypatch):
    real, calls = shard_roller.write_chunks, []

    def failing(fd, chunks):
        calls.append(len(chunks))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(fd, chunks)

    monkeypatch.setattr(shard_roller, "write_chunks", failing)
    monkeypatch.setattr(shardkit.storage.local, "MAP_MIN", 0)  # the pile is mapped while writing fails
    with pytest.raises(shardkit.StorageError, match=r"shard-\d+\.tar: cannot write: no space left on the device \(needed "):
        shuffle(inputs, tmp_path / "out", piles=3, maxcount=40, quiet=True)
    assert not (tmp_path / "out").exists()


def test_corrupt_input_in_pass_1_leaves_nothing(tmp_path, inputs):
    bad = tmp_path / "in" / "in-002.tar"
    bad.write_bytes(bad.read_bytes()[:3000])
    out = tmp_path / "out"
    with pytest.raises(shardkit.ShardkitError, match=r"in-002\.tar.*truncated"):
        shuffle(inputs, out, piles=3, quiet=True)
    assert not out.exists()


def test_refuses_to_replace_a_dataset_or_stray_shards(tmp_path, inputs):
    out = tmp_path / "out"
    shuffle(inputs, out, piles=2, quiet=True)
    with pytest.raises(shardkit.DatasetExistsError, match="overwrite"):
        shuffle(inputs, out, piles=2, quiet=True)
    os.unlink(out / "shardkit.json")
    with pytest.raises(shardkit.DatasetExistsError, match=r"shard-000000\.tar"):
        shuffle(inputs, out, piles=2, quiet=True)
    m = shuffle(inputs, out, piles=2, maxcount=1000, overwrite=True, quiet=True)
    # no manifest names the old shard any more, so nothing says shardkit wrote it: it stays
    assert sorted(os.listdir(out)) == ["shard-000000.tar", "shard-000000.v1.tar", "shardkit.json"] and m.samples == 300


def test_piles_default_from_the_memory_budget(tmp_path, inputs):
    total = sum(os.path.getsize(tmp_path / "in" / f"in-{k:03d}.tar") for k in range(4))
    m = shuffle(inputs, tmp_path / "out", memory="40KiB", quiet=True)
    assert m.extra["piles"] == -(-2 * total // (40 * 1024))
    # a budget smaller than the piles it asks for splits them: memory stays bounded
    m = shuffle(inputs, tmp_path / "out2", piles=2, memory="40KiB", quiet=True)
    assert m.extra["split_piles"] == 2 and m.samples == 300


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"piles": 0}, "piles: expected an integer >= 1 or None, got 0"),
        ({"piles": 2, "maxcount": "ten"}, "maxcount: expected an integer >= 1 or None, got 'ten'"),
        ({"piles": 2, "maxsize": "lots"}, "maxsize: expected a size like 2GiB or 500MB, got 'lots'"),
        ({"piles": 2, "maxsize": 1000}, "maxsize: expected at least 1536 bytes"),
        ({"memory": 1.5}, "memory: expected at least 1536 bytes"),
        ({"piles": 2, "seed": -1}, "seed: expected an integer >= 0, got -1"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(shardkit.ConfigError, match=message):
        ShuffleOptions(**kwargs)


def test_cli_shuffle(tmp_path, inputs, capsys):
    out = str(tmp_path / "out")
    assert main(["shuffle", inputs, "-o", out, "--piles", "3", "--maxcount", "100", "--seed", "4"]) == 0
    assert "300 samples in 3 shards (shard-000000.tar ... shard-000002.tar)" in capsys.readouterr().out
    packed = str(tmp_path / "packed")
    assert main(["shuffle", inputs, "-o", packed, "--piles", "3", "--maxcount", "100", "--compression", "zstd"]) == 0
    assert "300 samples in 3 shards (shard-000000.tar.zst ... shard-000002.tar.zst)" in capsys.readouterr().out
    one = str(tmp_path / "one")  # one pile, one shard: no "1 piles", no range of one name
    assert main(["shuffle", inputs, "-o", one, "--piles", "1", "--maxcount", "300"]) == 0
    assert capsys.readouterr().out == f"{one}: 300 samples in 1 shard (shard-000000.tar), via 1 pile\n"
    assert main(["shuffle", inputs, "-o", out, "--piles", "3", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit shuffle: error: ") and "already holds a shardkit dataset" in err and "Traceback" not in err
    assert main(["shuffle", str(tmp_path / "missing-*.tar"), "-o", out, "--overwrite", "-q"]) == 1
    assert "pattern matches no file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["shuffle", inputs])  # -o is required: a usage error
    assert exit_info.value.code == 2


def test_equal_keys_of_two_inputs_are_refused_unless_prefixed(tmp_path):
    """Two inputs repeating a key (a, b) and (a): refused by pass 1, whether the two land in one pile or in two."""
    import tarfile

    def shard(name: str, keys: list[str]) -> str:
        path = tmp_path / name
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key in keys:
                info = tarfile.TarInfo(f"{key}.txt")
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
        return str(path)

    inputs = [shard("s0.tar", ["a", "b"]), shard("s1.tar", ["a"])]
    where = set()
    for seed in range(12):
        out = tmp_path / f"out{seed}"
        with pytest.raises(
            shardkit.SampleError, match=r"has the key 'a' of (pile \d's )?sample \d \(offset \d+.*keys must be unique across"
        ) as e:
            shardkit.shuffle(inputs, out, piles=2, seed=seed, quiet=True, key_prefix="none")
        assert "--key-prefix unit" in str(e.value) or "key_prefix='unit'" in str(e.value)
        assert not out.exists()
        where.add("two piles" if "of pile" in str(e.value) else "one pile")
        prefixed = tmp_path / f"prefixed{seed}"
        shardkit.shuffle(inputs, prefixed, piles=2, seed=seed, key_prefix="unit", quiet=True)
        assert shardkit.verify(str(prefixed), quiet=True) == []
    assert where == {"one pile", "two piles"}  # some seeds route both to one pile, some to two


def test_the_roller_refuses_a_key_repeated_in_a_shard_or_across_a_boundary(tmp_path):
    buf = b"".join(tarwrite.member(f"{k}.bin", b"x") for k in "abca")
    bounds = np.arange(0, 5 * 1024, 1024)
    keys = np.array([b"a", b"b", b"c", b"a"])
    roller = ShardRoller(str(tmp_path / "one"), maxcount=None, maxsize=None)
    os.makedirs(roller.directory)
    roller.extend(buf, bounds[:-1], bounds[1:], keys)
    with pytest.raises(
        shardkit.SampleError, match=r"shuffle: shard-000000.tar: sample 3 \(offset 3072\) has the key 'a' of sample 0 \(offset 0\)"
    ):
        roller.close()
    roller.abort()
    # shards of two samples: "c" ends one and starts the next, where a reader of both in turn would merge them
    roller = ShardRoller(str(tmp_path / "two"), maxcount=2, maxsize=None)
    os.makedirs(roller.directory)
    roller.extend(buf, bounds[[0, 2, 2]], bounds[[1, 3, 3]], np.array([b"a", b"c", b"c"]))
    with pytest.raises(
        shardkit.SampleError,
        match=r"shuffle: shard-000001.tar: sample 0 \(offset 0\) has the key 'c' of the last sample of shard-000000.tar \(offset 1024\)",
    ):
        roller.close()
    roller.abort()


def test_an_overwrite_names_every_new_shard_alike_so_one_brace_pattern_reads_them(tmp_path, inputs):
    # the old set holds one shard, the new one three: shard-000000.v1.tar beside shard-000001.tar
    # would fit no brace pattern, and a reader of shard-{000000..000002}.tar would miss one
    out = tmp_path / "out"
    shuffle(inputs, out, piles=2, maxcount=1000, quiet=True)
    m = shuffle(inputs, out, piles=2, maxcount=100, overwrite=True, quiet=True)
    assert [p.name for p in m.piles] == [f"shard-{i:06d}.v1.tar" for i in range(3)]
    assert sorted(os.listdir(out)) == [*(p.name for p in m.piles), "shardkit.json"]
    braced = wds.WebDataset(str(out / "shard-{000000..000002}.v1.tar"), shardshuffle=False, empty_check=False)
    assert [s["__key__"] for s in braced] == [s["__key__"] for s in _read_wds(str(out))]
    m = shuffle(inputs, out, piles=2, maxcount=100, overwrite=True, quiet=True)  # the plain names are free again
    assert [p.name for p in m.piles] == [f"shard-{i:06d}.tar" for i in range(3)]


def test_every_shard_is_on_disk_before_the_manifest_and_the_throwaway_piles_are_not_flushed(tmp_path, inputs, monkeypatch):
    from shardkit.dataset import transaction
    from shardkit.storage import local

    events: list[str] = []
    real_fsync, real_install = local.fsync_file, transaction.install
    monkeypatch.setattr(local, "fsync_file", lambda path: real_fsync(path) or events.append(os.path.basename(path)))
    monkeypatch.setattr(local, "_syncfs", lambda: lambda fd: events.append("syncfs") or 0)  # every sync_files of a whole file system
    monkeypatch.setattr(transaction, "install", lambda *a, **k: events.append("manifest") or real_install(*a, **k))
    m = shuffle(inputs, tmp_path / "out", piles=3, maxcount=40, quiet=True)
    assert len(m.piles) == 8
    # pass 1's throwaway dataset is published with no sync of its piles; each shard is flushed before the output's manifest
    assert events == ["manifest", *(p.name for p in m.piles), "manifest"]


def test_a_shard_the_disk_cannot_flush_publishes_nothing(tmp_path, inputs, monkeypatch):
    import errno

    from shardkit.storage import local

    real = local.fsync_file

    def failing(path: str) -> None:
        if path.endswith("shard-000001.tar"):
            with local.guard(path, "flush to disk"):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(path)

    monkeypatch.setattr(local, "fsync_file", failing)
    with pytest.raises(shardkit.StorageError, match=r"shard-000001\.tar: .*flush to disk"):
        shuffle(inputs, tmp_path / "out", piles=3, maxcount=40, quiet=True)
    assert not (tmp_path / "out").exists()
    assert not [t for t in __import__("threading").enumerate() if t.name == "shardkit-fsync"]
