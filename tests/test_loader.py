"""The loader: coverage per epoch, determinism, ranks and workers, resume, lifecycle, batches."""

from __future__ import annotations

import collections
import gc
import json
import os
import re
import threading
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardkit
from shardkit.errors import ConfigError
from shardkit.loading import source as sources
from shardkit.loading.pile import read_pile
from shardkit.tar import write as tarwrite
from tests.conftest import make_samples

N = 200  # samples in the `dataset` fixture


def keys(items) -> list[str]:
    out: list[str] = []
    for item in items:
        k = item["__key__"]
        out.extend(k if isinstance(k, list) else [k])
    return out


def write_shards(directory, samples, per_shard: int, *, gz: bool = False) -> list[str]:
    """Plain WebDataset shards (no manifest), written member by member."""
    os.makedirs(directory, exist_ok=True)
    urls = []
    for s in range(0, len(samples), per_shard):
        body = b"".join(
            tarwrite.member(f"{x['__key__']}.{ext}", x[ext] if isinstance(x[ext], bytes) else str(x[ext]).encode())
            for x in samples[s : s + per_shard]
            for ext in ("bin", "cls")
        )
        url = os.path.join(directory, f"shard-{s // per_shard:03d}.tar" + (".gz" if gz else ""))
        data = body + tarwrite.TRAILER
        if gz:
            import gzip

            data = gzip.compress(data)
        with open(url, "wb") as f:
            f.write(data)
        urls.append(url)
    return urls


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("mix", [1, 3])
def test_every_sample_once_per_epoch(dataset, world, drop_last, mix):
    streams = [keys(shardkit.loader(dataset, decode=False, rank=r, world_size=world, drop_last=drop_last, mix=mix)) for r in range(world)]
    assert len({len(s) for s in streams}) == 1, "every rank yields the same count"
    everything = [k for s in streams for k in s]
    if drop_last:
        assert len(everything) == len(set(everything)) == N - N % world
    else:
        assert set(everything) == {f"s{i:07d}" for i in range(N)}
        assert len(everything) == -(-N // world) * world


def test_epochs_differ_and_repeat(dataset):
    with shardkit.loader(dataset, decode=False, seed=5) as loader:
        first, second = keys(loader), keys(loader)  # a finished epoch moves on by itself
        loader.set_epoch(0)
        again = keys(loader)
    assert first != second and sorted(first) == sorted(second)
    assert again == first
    assert keys(shardkit.loader(dataset, decode=False, seed=5)) == first
    assert keys(shardkit.loader(dataset, decode=False, seed=6)) != first


def test_shuffle_false_reads_manifest_order(dataset):
    got = keys(shardkit.loader(dataset, decode=False, shuffle=False))
    from shardkit import manifest

    m = manifest.read(dataset)
    expected = [k for p in m.piles for k in read_pile(os.path.join(dataset, p.name)).keys]
    assert got == expected


@pytest.mark.parametrize("batch_size", [None, 7])
def test_same_order_for_any_num_workers(dataset, batch_size):
    def tag(sample):
        sample["double"] = sample["cls"] * 2
        return sample

    outs = []
    for workers in (0, 1, 2):
        with shardkit.loader(dataset, batch_size=batch_size, map=tag, num_workers=workers, seed=2, drop_last=False) as loader:
            outs.append(list(loader))
    for other in outs[1:]:
        assert keys(other) == keys(outs[0])
        if batch_size:
            assert all((a["double"] == b["double"]).all() for a, b in zip(outs[0], other, strict=True))


@pytest.mark.parametrize("mix", [1, 2])
def test_same_global_order_for_any_world_size(dataset, mix):
    whole = keys(shardkit.loader(dataset, decode=False, mix=mix, world_size=1, rank=0))
    for world in (2, 3):
        joined = [k for r in range(world) for k in keys(shardkit.loader(dataset, decode=False, mix=mix, world_size=world, rank=r))]
        assert joined == whole[: len(joined)]


def test_rank_from_environment(dataset, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = shardkit.loader(dataset, decode=False)
    assert (loader.options.rank, loader.options.world_size, len(loader)) == (1, 2, N // 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK"):
        shardkit.loader(dataset)


def test_a_world_without_a_rank_is_refused_not_read_as_rank_0(dataset, monkeypatch):
    """Every process of a launch that sets WORLD_SIZE but not RANK would read rank 0's share."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"world_size is 4 \(from WORLD_SIZE\) but no rank was given: .*rank 0's share"):
        shardkit.loader(dataset, decode=False)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ConfigError, match=r"world_size is 2 \(from world_size\) but no rank was given"):
        shardkit.loader(dataset, decode=False, world_size=2)
    assert shardkit.loader(dataset, decode=False, world_size=2, rank=1).options.rank == 1
    assert shardkit.loader(dataset, decode=False, world_size=1).options.rank == 0
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match=r"rank: 2 \(from RANK\) is not in a world of size 1 \(from the default\): expected 0 to 0"):
        shardkit.loader(dataset, decode=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stop=st.integers(0, 60),
    batch_size=st.sampled_from([None, 1, 8]),
    mix=st.sampled_from([1, 2, 3]),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
)
def test_resume_equals_uninterrupted(dataset, stop, batch_size, mix, epoch, drop_last):
    options = dict(batch_size=batch_size, mix=mix, decode=False, drop_last=drop_last, rank=1, world_size=2)
    loader = shardkit.loader(dataset, **options)
    loader.set_epoch(epoch)
    full = keys(loader)
    loader.set_epoch(epoch)
    it = iter(loader)
    head = [next(it) for _ in range(min(stop, len(loader)))]
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    resumed = shardkit.loader(dataset, **options)
    resumed.load_state_dict(state)
    assert keys(head) + keys(resumed) == full
    assert resumed.state_dict()["epoch"] == epoch + 1, "the resumed epoch completes and moves on"


def test_state_after_a_finished_epoch_starts_the_next(dataset):
    loader = shardkit.loader(dataset, decode=False)
    list(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(seed=1), "seed=0"),
        (dict(drop_last=False), "drop_last"),
        (dict(mix=2), "mix"),
    ],
)
def test_resume_with_other_options_is_refused(dataset, change, message):
    state = shardkit.loader(dataset, decode=False).state_dict()
    with pytest.raises(ConfigError, match=message):
        shardkit.loader(dataset, decode=False, **change).load_state_dict(state)


def test_resume_on_another_dataset_is_refused(dataset, tmp_path):
    state = shardkit.loader(dataset, decode=False).state_dict()
    other = str(tmp_path / "other")
    with shardkit.PileWriter(other, piles=8, seed=3) as w:
        for s in make_samples(N - 1):
            w.write(s)
    with pytest.raises(ConfigError, match="different dataset"):
        shardkit.loader(other, decode=False).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a shardkit loader state"):
        shardkit.loader(dataset).load_state_dict({"epoch": 3})
    with pytest.raises(ConfigError, match="batch boundary"):
        shardkit.loader(dataset, batch_size=4).load_state_dict(dict(shardkit.loader(dataset, batch_size=4).state_dict(), position=5))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epoch", True, "load_state_dict: epoch: expected an integer >= 0, got True"),
        ("position", -1, f"load_state_dict: position: expected an integer between 0 and {N}, got -1"),
        ("position", N + 1, f"load_state_dict: position: expected an integer between 0 and {N}, got {N + 1}"),
    ],
)
def test_resume_state_numbers_are_checked(dataset, field, value, message):
    state = dict(shardkit.loader(dataset, decode=False).state_dict(), **{field: value})
    with pytest.raises(ConfigError, match=message):
        shardkit.loader(dataset, decode=False).load_state_dict(state)


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_threads_stop_after_close_break_and_gc(dataset):
    baseline = _threads()
    loader = shardkit.loader(dataset, decode=False)
    it = iter(loader)
    next(it)
    assert any(t.name.startswith("shardkit-reader") for t in _threads() - baseline)
    loader.close()
    loader.close()  # idempotent
    assert _threads() == baseline
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)

    loader = shardkit.loader(dataset, decode=False)
    for _ in loader:
        break
    assert _threads() == baseline

    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert _threads() == baseline

    with shardkit.loader(dataset, decode=False) as loader:
        next(iter(loader))
    assert _threads() == baseline
    del loader
    gc.collect()
    assert _threads() == baseline


def test_worker_processes_stop_on_close(dataset):
    import multiprocess

    with shardkit.loader(dataset, batch_size=10, num_workers=2) as loader:
        next(iter(loader))
        assert len(multiprocess.active_children()) == 2
    assert multiprocess.active_children() == []


def test_batches_collate(tmp_path):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=2, seed=0) as w:
        for i in range(12):
            w.write({"__key__": f"k{i:02d}", "npy": np.full((2, 3), i, dtype=np.float32), "cls": i, "txt": f"t{i}", "json": {"i": i}})
    batches = list(shardkit.loader(out, batch_size=5, drop_last=False, seed=1))
    assert [len(b["__key__"]) for b in batches] == [5, 5, 2]
    b = batches[0]
    assert b["npy"].shape == (5, 2, 3) and b["npy"].dtype == np.float32
    assert b["cls"].dtype.kind == "i" and list(b["cls"]) == [int(k[1:]) for k in b["__key__"]]
    assert b["txt"] == [f"t{int(k[1:])}" for k in b["__key__"]]
    assert b["json"] == [{"i": int(k[1:])} for k in b["__key__"]]
    assert (b["npy"][:, 0, 0] == b["cls"]).all()
    custom = list(shardkit.loader(out, batch_size=4, collate=lambda xs: [x["cls"] for x in xs]))
    assert len(custom) == 3 and all(isinstance(c, list) and len(c) == 4 for c in custom)
    assert len(shardkit.loader(out, batch_size=5)) == 2 and len(shardkit.loader(out, batch_size=5, drop_last=False)) == 3


def test_unequal_arrays_collate_to_a_list(tmp_path):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=1, seed=0) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "npy": np.zeros(i + 1)})
    (batch,) = shardkit.loader(out, batch_size=3)
    assert isinstance(batch["npy"], list) and sorted(len(a) for a in batch["npy"]) == [1, 2, 3]


@pytest.mark.parametrize("mapped", [lambda s: s["cls"], lambda s: (s["cls"], s["__key__"]), lambda s: "text"], ids=["int", "tuple", "str"])
def test_a_map_that_returns_no_dict_needs_a_collate(dataset, mapped):
    """The default collate batches dicts: anything else is an error naming map and collate."""
    with pytest.raises(
        shardkit.ConfigError, match=r"collate: the default collate batches samples that are dicts, not (int|tuple|str) values .*collate="
    ):
        next(iter(shardkit.loader(dataset, batch_size=4, map=mapped)))
    assert len(next(iter(shardkit.loader(dataset, batch_size=4, map=mapped, collate=list)))) == 4


@pytest.mark.parametrize("wrap", [collections.UserDict, types.MappingProxyType], ids=["UserDict", "mappingproxy"])
def test_a_map_that_returns_another_mapping_is_batched(dataset, wrap):
    """Any mapping has fields the default collate can tell, as a dict has."""
    batch = next(iter(shardkit.loader(dataset, batch_size=4, map=lambda s: wrap(s))))
    plain = next(iter(shardkit.loader(dataset, batch_size=4)))
    assert batch["__key__"] == plain["__key__"] and np.array_equal(batch["cls"], plain["cls"])


@pytest.mark.parametrize("gz", [False, True])
def test_plain_webdataset_shards(tmp_path, gz):
    samples = make_samples(50)
    urls = write_shards(tmp_path / "shards", samples, 12, gz=gz)
    expected = {s["__key__"] for s in samples}
    ext = ".tar.gz" if gz else ".tar"
    for source in (urls, str(tmp_path / "shards" / f"shard-*{ext}"), str(tmp_path / "shards" / f"shard-{{000..004}}{ext}")):
        loader = shardkit.loader(source, seed=1)
        got = list(loader)
        assert {s["__key__"] for s in got} == expected and len(got) == 50
        assert all(isinstance(s["cls"], int) for s in got)
    by_key = {s["__key__"]: s for s in samples}
    assert all(s["bin"] == by_key[s["__key__"]]["bin"] for s in shardkit.loader(urls, decode=False))


def test_reads_webdataset_writer_output(tmp_path):
    import webdataset as wds

    pattern = str(tmp_path / "w-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=7, verbose=0) as sink:
        for i in range(20):
            sink.write({"__key__": f"x{i:03d}", "txt": f"hello {i}", "cls": i})
    got = list(shardkit.loader(str(tmp_path / "w-*.tar"), seed=0))
    assert sorted(s["__key__"] for s in got) == [f"x{i:03d}" for i in range(20)]
    assert all(s["txt"] == f"hello {s['cls']}" for s in got)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(batch_size=0), "batch_size"),
        (dict(on_error="ignore"), "on_error"),
        (dict(decode="jpeg"), "decode"),
        (dict(mix=2, shuffle=False), "mix"),
        (dict(num_workers=-1), "num_workers"),
        (dict(max_pile_bytes="lots"), "max_pile_bytes"),
        (dict(rank=2, world_size=2), "rank"),
        (dict(map=3), "map"),
        (dict(seed=-1), "seed"),
        # views of piles in this process cannot cross to worker processes that batch or map them
        (dict(views=True, decode=False, num_workers=2, batch_size=4), "views: True with num_workers=2"),
        (dict(views=True, decode=False, num_workers=1, map=dict), "views: True with num_workers=1"),
        # views are of raw fields: decoded fields are objects of their own
        (dict(views=True), r"views: True hands out raw fields as memoryviews, which needs decode=False; with decode=True"),
        (dict(views=True, decode="pil"), r"with decode='pil'"),
    ],
)
def test_bad_options_name_the_option(dataset, bad, message):
    with pytest.raises(ConfigError, match=message):
        shardkit.loader(dataset, **bad)


def test_options_from_a_mapping_refuse_unknown_keys():
    assert shardkit.LoaderOptions.from_dict({"batch_size": 3}).batch_size == 3
    with pytest.raises(ConfigError, match="batchsize: not a loader option"):
        shardkit.LoaderOptions.from_dict({"batchsize": 3})


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_tarfile_formats(tmp_path, fmt):
    import io
    import tarfile

    url = str(tmp_path / f"{fmt}.tar")
    names = {"ustar": ["a/b.c/k1.txt"], "gnu": ["k1.txt", "x" * 120 + ".txt"], "pax": ["k1.txt", "é" * 60 + ".txt"]}[fmt]
    with tarfile.open(url, "w", format={"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[fmt]) as t:
        for name in names:
            info = tarfile.TarInfo(name)
            data = name.encode()
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    got = {s["__key__"]: s["txt"] for s in shardkit.loader(url)}
    assert got == {n[: -len(".txt")]: n for n in names}


# -- bad input --------------------------------------------------------------------------------


def pile_path(dataset: str, index: int = 0) -> str:
    return os.path.join(dataset, f"pile-{index:06d}.tar")


def rewrite(path: str, edit) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data = edit(data)
    with open(path, "wb") as f:
        f.write(data)


def fix_header_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\x00 " % sum(data[at : at + 512])


def read_all(source, **options) -> list:
    return list(shardkit.loader(source, seed=0, **options))


def test_truncated_pile_with_manifest(dataset):
    rewrite(pile_path(dataset), lambda d: d[:1000])
    with pytest.raises(shardkit.CorruptShardError, match=r"pile-000000\.tar: file is 1000 bytes, the manifest says \d+ \(truncated\)$"):
        read_all(dataset)


def test_a_pile_longer_than_its_manifest_says_is_named_so_as_verify_names_it(dataset):
    rewrite(pile_path(dataset), lambda d: d + bytes(512))
    problem = shardkit.verify(dataset, quiet=True)[0]  # then the checksum
    assert re.fullmatch(r"file is \d+ bytes, the manifest says \d+ \(longer than written\)", problem.message)
    with pytest.raises(shardkit.CorruptShardError, match=rf"pile-000000\.tar: {re.escape(problem.message)}$"):
        read_all(dataset)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (540, r"member 0 \('s0000000\.bin'\) at offset 0: data of 64 bytes runs past the end of the file \(540 bytes\)"),
        (2000, r"member 2 at offset 2048: archive is truncated inside a header"),
    ],
)
def test_truncated_plain_shard(tmp_path, cut, message):
    (url,) = write_shards(tmp_path, make_samples(5), 5)
    rewrite(url, lambda d: d[:cut])
    with pytest.raises(shardkit.CorruptShardError, match=r"shard-000\.tar: " + message):
        read_all(url)


def test_header_size_past_the_end(tmp_path):
    (url,) = write_shards(tmp_path, make_samples(3), 3)

    def grow(d: bytearray) -> bytearray:
        d[124:136] = b"%011o\x00" % (10**6)
        fix_header_checksum(d, 0)
        return d

    rewrite(url, grow)
    with pytest.raises(
        shardkit.CorruptShardError,
        match=r"shard-000\.tar: member 0 \('s0000000\.bin'\) at offset 0: data of 1000000 bytes runs past the end",
    ):
        read_all(url)


def test_bad_header_checksum(tmp_path):
    (url,) = write_shards(tmp_path, make_samples(3), 3)
    second = 512 + 512 * (-(-64 // 512))  # header of member 1 after member 0's 64-byte payload

    def flip(d: bytearray) -> bytearray:
        d[second + 3] ^= 1
        return d

    rewrite(url, flip)
    with pytest.raises(
        shardkit.CorruptShardError, match=rf"shard-000\.tar: member 1 at offset {second}: header checksum is \d+, expected \d+"
    ):
        read_all(url)


def test_pile_checksum_disagrees_with_manifest(dataset):
    def flip(d: bytearray) -> bytearray:
        d[600] ^= 0xFF  # inside the first member's data
        return d

    rewrite(pile_path(dataset), flip)
    with pytest.raises(shardkit.CorruptShardError, match=r"pile-000000\.tar: checksum is crc32:\w+, the manifest says crc32:\w+"):
        read_all(dataset)
    assert len(read_all(dataset, verify=False, decode=False)) == N


def test_sample_count_disagrees_with_manifest(dataset):
    from shardkit import manifest

    path = os.path.join(dataset, manifest.MANIFEST)
    with open(path) as f:
        doc = json.load(f)
    doc["piles"][0]["samples"] += 1
    doc["samples"] += 1
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(shardkit.ManifestError, match=r"pile-000000\.tar: holds \d+ samples, the manifest says \d+"):
        read_all(dataset, decode=False)


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil.txt", "a/../../evil.txt"])
def test_unsafe_member_names(tmp_path, name):
    url = str(tmp_path / "bad.tar")
    with open(url, "wb") as f:
        f.write(tarwrite.member("ok.txt", b"fine") + tarwrite.member(name, b"evil") + tarwrite.TRAILER)
    with pytest.raises(shardkit.CorruptShardError, match=r"bad\.tar: member 1 .* unsafe member name"):
        read_all(url)


@pytest.mark.parametrize(
    ("kind", "word"), [("SYMTYPE", "symlink"), ("CHRTYPE", "character device"), ("FIFOTYPE", "fifo"), ("LNKTYPE", "hard link")]
)
def test_non_regular_members(tmp_path, kind, word):
    import io
    import tarfile

    url = str(tmp_path / "odd.tar")
    with tarfile.open(url, "w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        t.addfile(info, io.BytesIO(b"hi"))
        odd = tarfile.TarInfo("b.txt")
        odd.type = getattr(tarfile, kind)
        odd.linkname = "a.txt"
        t.addfile(odd)
    with pytest.raises(
        shardkit.CorruptShardError, match=rf"odd\.tar: member 1 \('b\.txt/?'\) at offset 1024: expected a regular file, found a {word}"
    ):
        read_all(url)


def test_pile_over_max_pile_bytes_is_refused_unread(dataset, monkeypatch):
    from shardkit import storage

    for method in ("read", "read_whole"):
        real = getattr(storage.LocalStore, method)

        def no_pile_read(store, name, real=real, **kw):
            assert not name.endswith(".tar"), f"{store.url(name)} was read"
            return real(store, name, **kw)

        monkeypatch.setattr(storage.LocalStore, method, no_pile_read)
    with pytest.raises(shardkit.PileTooLargeError, match=r"pile-\d+\.tar: \d+ bytes is over the memory limit max_pile_bytes=1000"):
        read_all(dataset, max_pile_bytes="1000")


def test_undecodable_sample_names_pile_and_key(tmp_path):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=1, seed=0) as w:
        w.write({"__key__": "good", "cls": 1})
        w.write({"__key__": "broken", "cls": b"not a number"})
    with pytest.raises(shardkit.DecodeError, match=r"pile-000000\.tar: sample 'broken': field 'cls' cannot be decoded \(ValueError"):
        read_all(out)
    loader = shardkit.loader(out, on_error="skip")
    assert [s["__key__"] for s in loader] == ["good"]
    assert loader.stats.skipped_samples == 1 and "broken" in loader.stats.errors[0]
    for workers in (0, 1):
        with shardkit.loader(out, batch_size=2, on_error="warn", num_workers=workers, drop_last=False) as loader:
            (batch,) = list(loader)
        assert batch["__key__"] == ["good"] and loader.stats.skipped_samples == 1
    with shardkit.loader(out, batch_size=2, num_workers=1) as loader, pytest.raises(shardkit.DecodeError, match="broken"):
        list(loader)


def test_error_in_the_reader_thread_reaches_the_consumer(dataset, monkeypatch):
    class Boom(Exception):
        pass

    def fail(self, index, **kw):
        raise Boom(f"pile {index} exploded")

    monkeypatch.setattr(sources.Source, "fetch", fail)
    baseline = _threads()
    with pytest.raises(Boom, match="exploded"):
        read_all(dataset, decode=False)
    gc.collect()
    assert _threads() == baseline


def test_skip_a_bad_pile_and_count_it(dataset, caplog):
    from shardkit import manifest

    bad = manifest.read(dataset).piles[2]
    rewrite(os.path.join(dataset, bad.name), lambda d: d[:-1024])
    for policy in ("skip", "warn"):
        loader = shardkit.loader(dataset, decode=False, on_error=policy)
        got = keys(loader)
        assert len(got) == len(set(got)) == N - bad.samples
        assert (loader.stats.skipped_piles, loader.stats.skipped_samples) == (1, bad.samples)
        assert bad.name in loader.stats.errors[0]
    assert any("skipped" in r.message for r in caplog.records)


# -- uniformity through the real code -----------------------------------------------------------


@pytest.mark.parametrize("mix", [1, 2])
def test_loader_order_is_router_plus_plan(tmp_path, mix):
    """The full writer + loader give exactly the order the uniformity test below counts."""
    from tests.test_plan import plan_permutation

    for seed in range(60):
        out = str(tmp_path / f"ds{seed}")
        with shardkit.PileWriter(out, piles=3, seed=seed) as w:
            for i in range(5):
                w.write({"__key__": str(i), "cls": i})
        got = tuple(int(k) for k in keys(shardkit.loader(out, seed=seed, mix=mix, decode=False)))
        assert got == plan_permutation(seed, mix)


@pytest.mark.slow
@pytest.mark.parametrize("mix", [1, 2])
def test_first_epoch_is_exactly_uniform(mix):
    """All 120 orders of 5 samples in 3 piles are equally likely over 50,000 seeds (chi-square)."""
    from tests.test_plan import chi_square_p, permutation_counts

    hits = permutation_counts(50_000, mix)
    assert hits.min() > 0
    assert chi_square_p(hits) > 1e-4, hits


@pytest.mark.parametrize("long_name", [False, True])
def test_duplicate_extension_in_a_sample(tmp_path, long_name):
    url = str(tmp_path / "dup.tar")
    key = "k" * (120 if long_name else 3)  # long names take the careful walk, short ones the fast one
    with open(url, "wb") as f:
        f.write(
            tarwrite.member(f"{key}.txt", b"a")
            + tarwrite.member(f"{key}.cls", b"1")
            + tarwrite.member(f"{key}.txt", b"b")
            + tarwrite.TRAILER
        )
    with pytest.raises(shardkit.CorruptShardError, match=rf"dup\.tar: member 2 .* sample '{key}' already has a 'txt' member"):
        read_all(url)


@pytest.mark.parametrize(("mix", "prefetch", "workers"), [(1, 1, 0), (1, 0, 0), (1, 2, 0), (3, 1, 0), (3, 0, 0), (2, 1, 1)])
def test_resident_piles_stay_within_mix_plus_prefetch(dataset, monkeypatch, mix, prefetch, workers):
    import weakref

    from shardkit import storage

    class Tracked(bytearray):
        pass

    alive: set[int] = set()
    peaks = [0]

    def tracked_read(store, name, **kw):
        with open(store.url(name), "rb") as f:
            buf = Tracked(f.read())
        alive.add(id(buf))
        weakref.finalize(buf, alive.discard, id(buf))
        peaks.append(len(alive))  # measured in the reader thread, as each pile arrives
        return buf

    monkeypatch.setattr(storage.LocalStore, "read_whole", tracked_read)
    options = dict(decode=False, mix=mix, prefetch=prefetch, num_workers=workers, batch_size=5 if workers else None)
    with shardkit.loader(dataset, **options) as loader:
        for _ in loader:
            peaks.append(len(alive))
    # mix=k reads from k + 1 piles at once
    assert 1 <= max(peaks) <= (mix + 1 if mix > 1 else 1) + prefetch


@pytest.mark.parametrize(("batch_size", "mix"), [(None, 1), (6, 2)])
def test_resume_with_worker_processes_and_decoding(dataset, batch_size, mix):
    options = dict(batch_size=batch_size, mix=mix, num_workers=1, map=lambda s: dict(s, label=s["cls"] + 1), seed=9)
    with shardkit.loader(dataset, **options) as loader:
        full = keys(loader)
        for stop in (0, 3, len(loader) - 1, len(loader)):
            loader.set_epoch(0)
            it = iter(loader)
            head = [next(it) for _ in range(stop)]
            state = loader.state_dict()
            it.close()
            with shardkit.loader(dataset, **options) as resumed:
                resumed.load_state_dict(state)
                assert keys(head) + keys(resumed) == full


def test_decoding_images_and_pickle(tmp_path):
    out = str(tmp_path / "ds")
    image = np.zeros((4, 6, 3), dtype=np.uint8)
    image[1, 2] = (255, 0, 0)
    with shardkit.PileWriter(out, piles=1, seed=0) as w:
        w.write({"__key__": "a", "png": image, "pyd": {"x": 1}})
    (sample,) = shardkit.loader(out)
    assert sample["png"].dtype == np.uint8 and (sample["png"] == image).all()
    assert isinstance(sample["pyd"], bytes), "pickle is never decoded unless allowed"
    (sample,) = shardkit.loader(out, decode="pil", allow_pickle=True)
    assert sample["png"].size == (6, 4) and sample["pyd"] == {"x": 1}
    (sample,) = shardkit.loader(out, decode=False)
    assert isinstance(sample["png"], bytes)
    codecs = shardkit.Codecs()
    codecs.register_decoder("png", lambda b: len(b))
    (sample,) = shardkit.loader(out, decode=codecs)
    assert isinstance(sample["png"], int)


def test_rank_from_torch_distributed(dataset, monkeypatch):
    import sys
    import types

    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 2, get_world_size=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=dist))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = shardkit.loader(dataset, decode=False)
    assert (loader.options.rank, loader.options.world_size) == (2, 3)
    assert shardkit.loader(dataset, rank=0, world_size=1).options.rank == 0, "arguments win"


def test_set_epoch_after_load_state_dict_resumes_the_readme_loop(dataset):
    """The usual loop calls set_epoch(e) right after loading a state for e: it must not restart."""
    full = shardkit.loader(dataset, batch_size=16, seed=5)
    full.set_epoch(1)
    expected = [b["__key__"] for b in full]
    first = shardkit.loader(dataset, batch_size=16, seed=5)
    first.set_epoch(1)
    it = iter(first)
    head = [next(it)["__key__"] for _ in range(3)]
    state = first.state_dict()
    first.close()
    resumed = shardkit.loader(dataset, batch_size=16, seed=5)
    resumed.load_state_dict(state)
    for epoch in range(state["epoch"], 2):
        resumed.set_epoch(epoch)
        tail = [b["__key__"] for b in resumed]
    assert head + tail == expected
    # an abandoned iteration is different: set_epoch then starts the epoch from the top
    it = iter(resumed)
    next(it)
    resumed.set_epoch(1)
    assert [b["__key__"] for b in resumed] == expected


class _DieWhileMarked:
    """A map that kills its worker process while a marker file exists (OOM killer, native crash)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, sample):
        if os.path.exists(self.marker):
            os._exit(3)
        return sample


def test_a_dead_worker_is_named_and_the_next_epoch_starts_fresh_workers(dataset, tmp_path):
    marker = tmp_path / "die"
    marker.touch()
    loader = shardkit.loader(dataset, batch_size=8, num_workers=2, decode=False, map=_DieWhileMarked(str(marker)))
    with pytest.raises(shardkit.WorkerError, match=r"shardkit worker process \d .* died with a task in hand \(exit code 3\)"):
        list(loader)
    marker.unlink()
    loader.set_epoch(0)
    assert sum(len(b["__key__"]) for b in loader) == len(loader) * 8
    loader.close()


def test_mapped_samples_that_only_dill_can_pickle_cross_the_worker_pipe(dataset):
    with shardkit.loader(dataset, batch_size=None, num_workers=1, decode=False, map=lambda s: (s["__key__"], lambda: 1)) as loader:
        items = list(loader)
    assert len(items) == len(loader) and callable(items[0][1])


def test_set_epoch_inside_the_loop_names_the_next_iteration(dataset):
    """set_epoch(e) while an epoch is read: that iteration goes on to its end, the next reads
    epoch e (not the one after the epoch that was running), and a state taken in between names
    the start of e."""

    def epoch_keys(epoch: int) -> list[str]:
        other = shardkit.loader(dataset, batch_size=16, seed=5)
        other.set_epoch(epoch)
        return keys(other)

    loader = shardkit.loader(dataset, batch_size=16, seed=5)
    read = []
    for step, batch in enumerate(loader):
        if step == 2:
            loader.set_epoch(5)
        if step == 6:
            state = loader.state_dict()
        read += batch["__key__"]
    assert read == epoch_keys(0)
    assert loader.epoch == 5 and (state["epoch"], state["position"]) == (5, 0)
    assert keys(loader) == epoch_keys(5)
    assert loader.epoch == 6  # without set_epoch, the epoch after the one read
    # the epoch being read, named again inside its loop (a hook that keeps the loader in step),
    # redirects nothing: each epoch is read once, in turn
    loader = shardkit.loader(dataset, batch_size=16, seed=5)
    read = []
    for epoch in range(3):
        for batch in loader:
            loader.set_epoch(epoch)
            read += batch["__key__"]
    assert read == epoch_keys(0) + epoch_keys(1) + epoch_keys(2)


def test_an_iteration_ended_by_another_raises_instead_of_ending_quietly(dataset):
    """A loader reads one iteration at a time: an iterator whose iteration a newer one, a loaded
    state or close() ended raises at its next item, where a loop would otherwise lose the rest of
    the epoch without a word; the newer iteration reads the whole epoch."""
    loader = shardkit.loader(dataset, batch_size=16, seed=5)
    whole = keys(loader)
    loader.set_epoch(0)
    train = iter(loader)
    head = [next(train) for _ in range(3)]
    assert keys(head) == whole[:48]
    assert keys(loader) == whole  # the newer iteration reads epoch 0 (the one not read to its end) whole
    with pytest.raises(RuntimeError, match=r"ended before its last item: a newer iteration of this loader began"):
        next(train)
    # made before either started: the first raises, the second reads its epoch whole
    loader.set_epoch(0)
    first, second = iter(loader), iter(loader)
    assert keys(second) == whole
    with pytest.raises(RuntimeError, match=r"a newer iteration"):
        next(first)
    # a loaded state or close() ends it too; an iterator read to its end just ends; close() on one still works
    loader.set_epoch(0)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"load_state_dict\(\) was called"):
        next(it)
    done = iter(loader)
    assert keys(done) == whole
    # one that handed out its last item, though not yet asked for the next, just ends
    loader.set_epoch(0)
    read_out = iter(loader)
    assert keys([next(read_out) for _ in range(len(loader))]) == whole
    next(iter(loader))
    with pytest.raises(StopIteration):
        next(read_out)
    it = iter(loader)
    next(it)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    it = iter(loader)
    next(it)
    loader.close()
    assert list(done) == []
    with pytest.raises(RuntimeError, match=r"the loader was closed"):
        next(it)


def test_a_map_or_collate_raising_stopiteration_is_an_error_not_the_end_of_the_epoch(tmp_path):
    """StopIteration from the user's function would end the loop it rises through: the epoch cut
    short, silently. It is a RuntimeError naming the sample (skipped under on_error='skip')."""
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=4, seed=0) as w:
        for i in range(400):
            w.write({"__key__": f"{i:05d}", "cls": i % 10})

    def bad(s):
        if s["__key__"] == "00200":
            next(iter([]))
        return s

    with pytest.raises(RuntimeError, match=r"map\(\) raised StopIteration on sample '00200' of .*pile-00000\d\.tar"):
        list(shardkit.loader(out, map=bad))
    loader = shardkit.loader(out, map=bad, on_error="skip")
    assert sum(1 for _ in loader) == 399
    with pytest.raises(RuntimeError, match=r"collate\(\) raised StopIteration on the batch ending at position 10"):
        list(shardkit.loader(out, batch_size=10, collate=lambda batch: next(iter([]))))
