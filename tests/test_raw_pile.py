"""pile() copies samples without decoding them, and its piles equal re-encoding every sample."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import numpy as np
import pytest
from conftest import make_samples, write_wds_shards

import shardkit
from shardkit import manifest
from shardkit.loading.pile import read_pile
from shardkit.piles import canonical as _raw
from shardkit.piles import parts, publish
from shardkit.piles.encode import encode_sample
from shardkit.tar import write as tarwrite
from shardkit.tar.shard import iter_shard, read_shard


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def files(out) -> dict[str, bytes]:
    return {name: read(os.path.join(out, name)) for name in sorted(os.listdir(out))}


def re_encoded(tmp_path, urls, **kwargs) -> dict[str, bytes]:
    """What the slow path writes: every sample decoded to a dict and encoded again."""
    out = tmp_path / "re-encoded"
    shardkit.preprocess(urls, iter_shard, out, **kwargs)
    return files(out)


def write_tarfile(path, names, fmt=tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for name in names:
            data = f"<{name}>".encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname = len(data), 1_700_000_000.25, 0o600, "alice"
            tf.addfile(info, io.BytesIO(data))


@pytest.fixture
def foreign(tmp_path) -> list[str]:
    """Shards as other tools write them: webdataset (pax mtime per member), tar formats, gzip."""
    paths = write_wds_shards(
        tmp_path,
        "wds-{}.tar",
        4,
        lambda k, i: {"__key__": f"w{k}/{i:03d}", "txt": f"{k}-{i}" * (i % 7), "cls": str(i % 3), "json": b'{"a": 1}'} if i < 30 else None,
    )
    odd = [
        "a.txt",
        "b.txt",  # fields out of order: encode_sample sorts them
        "b.cls",
        "c.tar.gz",  # an extension with a dot
        "d.ünïcode",  # non-ASCII: shardkit writes a pax header
        "e/" + "long" * 30 + ".bin",  # over 100 bytes: pax too
        "f.bin",
        "f._meta",  # a single leading underscore is an ordinary field
        "g.__hidden",  # '__' fields are metadata: encode_sample leaves them out
        "g.z",
    ]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = str(tmp_path / f"tarfile-{fmt}.tar")
        write_tarfile(path, [f"t{fmt}/{name}" for name in odd], fmt)  # keys are unique across inputs
        paths.append(path)
    gz = paths.pop(3) + ".gz"
    with open(gz, "wb") as f:
        f.write(gzip.compress(read(gz[: -len(".gz")])))
    return [*paths, gz]


def own_shards(tmp_path, count: int = 4) -> list[str]:
    """``count`` shards already in shardkit's form (what piles and shuffled shards are), 30
    samples each, every key distinct."""
    paths = []
    samples = make_samples(30 * count, size=700)
    for k in range(count):
        path = str(tmp_path / f"own-{k}.tar")
        with open(path, "wb") as f:
            for s in samples[k::count]:
                f.write(encode_sample(s)[0])
            f.write(tarwrite.TRAILER)
        paths.append(path)
    return paths


@pytest.fixture
def canonical_shards(tmp_path) -> list[str]:
    return own_shards(tmp_path)


@pytest.mark.parametrize("workers", [1, 3])
def test_piles_equal_re_encoding_every_sample_for_foreign_shards(tmp_path, foreign, workers):
    m = shardkit.pile(foreign, tmp_path / "fast", piles=4, seed=7, workers=workers, buffer_size="8KiB", quiet=True)
    assert files(tmp_path / "fast") == re_encoded(tmp_path, foreign, piles=4, seed=7, quiet=True)
    assert m.samples == 3 * 30 + 2 * 7 + 30
    assert "__hidden" not in m.fields and {"_meta", "tar.gz", "ünïcode", "json"} <= set(m.fields)


def test_piles_equal_re_encoding_for_shards_already_canonical(tmp_path, canonical_shards):
    shardkit.pile(canonical_shards, tmp_path / "fast", piles=5, seed=1, quiet=True)
    assert files(tmp_path / "fast") == re_encoded(tmp_path, canonical_shards, piles=5, seed=1, quiet=True)


def test_a_canonical_shard_is_sliced_not_copied(canonical_shards):
    buf = read(canonical_shards[0])
    found = _raw.canonical_samples(buf, canonical_shards[0])
    assert all(isinstance(c, memoryview) and c.obj is buf for c in found.chunks)
    assert b"".join(found.chunks) + tarwrite.TRAILER == buf
    assert found.sizes.tolist() == [len(c) for c in found.chunks]


def test_garbage_in_padding_is_not_copied(tmp_path, canonical_shards):
    """A shard in shardkit's form except for one padding byte is rewritten, not sliced."""
    buf = bytearray(read(canonical_shards[0]))
    buf[512 + 700 + 5] = 0x7F  # in the padding after the first member's 700 data bytes
    dirty = str(tmp_path / "dirty.tar")
    with open(dirty, "wb") as f:
        f.write(buf)
    found = _raw.canonical_samples(bytes(buf), dirty)
    assert bytes(found.chunks[0]) == encode_sample(next(iter(iter_shard(dirty))))[0]
    shardkit.pile([dirty], tmp_path / "fast", piles=2, quiet=True)
    assert files(tmp_path / "fast") == re_encoded(tmp_path, [dirty], piles=2, quiet=True)


def test_foreign_samples_get_shardkit_headers(tmp_path, foreign):
    buf = read_shard(foreign[0])
    found = _raw.canonical_samples(buf, foreign[0])
    assert [bytes(c) for c in found.chunks] == [encode_sample(s)[0] for s in iter_shard(foreign[0])]
    assert found.fields == {"txt", "cls", "json"}


def test_piles_of_pax_shards_read_completely_with_webdataset_and_tarfile(tmp_path, foreign):
    import webdataset as wds

    m = shardkit.pile(foreign[:3], tmp_path / "out", piles=3, seed=2, quiet=True)
    urls = [str(tmp_path / "out" / p.name) for p in m.piles]
    theirs = {s["__key__"]: (s["txt"], s["cls"], s["json"]) for s in wds.WebDataset(urls, shardshuffle=False)}
    source = {s["__key__"]: (s["txt"], s["cls"], s["json"]) for u in foreign[:3] for s in iter_shard(u)}
    assert theirs == source and len(theirs) == 90
    for url in urls:
        with tarfile.open(url) as tf:
            assert {(t.mtime, t.uname, t.mode, t.pax_headers.get("mtime")) for t in tf.getmembers()} == {(0, "", 0o644, None)}


def test_output_is_byte_identical_for_any_number_of_workers_and_skips(tmp_path, foreign):
    own = own_shards(tmp_path, 12)
    broken = [str(tmp_path / f"broken-{k}.tar") for k in range(3)]  # three files: one named twice is refused
    for path in broken:
        with open(path, "wb") as f:
            f.write(read(own[1])[:3000])
    wds = write_wds_shards(tmp_path, "more-{}.tar", 4, lambda k, i: {"__key__": f"m{k}/{i:03d}", "txt": f"{k}-{i}"} if i < 20 else None)
    urls = [*own[:2], broken[0], *foreign[:2], *own[2:4]]
    for r in (1, 2):  # keys are unique across the inputs
        urls += [*own[4 * r : 4 * r + 2], broken[r], *wds[2 * r - 2 : 2 * r], *own[4 * r + 2 : 4 * r + 4]]
    kwargs = {"piles": 6, "seed": 3, "buffer_size": "16KiB", "on_error": "skip", "quiet": True}
    m1 = shardkit.pile(urls, tmp_path / "w1", workers=1, **kwargs)
    m3 = shardkit.pile(urls, tmp_path / "w3", workers=3, **kwargs)
    assert m1 == m3 and files(tmp_path / "w1") == files(tmp_path / "w3")
    assert m1.skipped_units == 3
    for info in m1.piles:  # checksums computed while writing and merging match the files
        read_pile(str(tmp_path / "w1" / info.name), expected=info)


def test_split_piles_are_byte_identical_too(tmp_path, canonical_shards):
    a = shardkit.pile(canonical_shards, tmp_path / "a", piles=2, max_pile_bytes="20KiB", workers=1, quiet=True)
    b = shardkit.pile(canonical_shards, tmp_path / "b", piles=2, max_pile_bytes="20KiB", workers=2, quiet=True)
    assert a.split_piles == 2 and len(a.piles) > 2
    assert a == b and files(tmp_path / "a") == files(tmp_path / "b")
    for info in a.piles:
        assert info.bytes <= 20 * 1024
        read_pile(str(tmp_path / "a" / info.name), expected=info)


@pytest.mark.parametrize(
    ("names", "error", "message"),
    [
        (["a//b.txt"], shardkit.SampleError, r"sample key 'a//b': no leading '/', empty or '\.\.' path components"),
        (
            ["noext"],
            shardkit.SampleError,
            r"sample 'noext': a field with an empty name \(in a tar shard, a member named 'noext', with no '\.EXTENSION'",
        ),
        (["k.txt", "k.cls", "k.txt"], shardkit.CorruptShardError, r"sample 'k' already has a 'txt' member"),
    ],
)
def test_bad_samples_fail_as_they_do_when_re_encoded(tmp_path, names, error, message):
    path = str(tmp_path / "bad.tar")
    write_tarfile(path, ["fine.txt", *names])
    with pytest.raises(error, match=r"input unit 0 \(.*bad.tar'\): .*" + message) as fast:
        shardkit.pile([path], tmp_path / "fast", piles=2, quiet=True)
    with pytest.raises(error, match=message) as slow:
        shardkit.preprocess([path], iter_shard, tmp_path / "slow", piles=2, quiet=True)
    assert str(fast.value) == str(slow.value)  # the same words, the same position
    assert not manifest.is_dataset(str(tmp_path / "fast"))


def test_a_sample_over_max_pile_bytes_is_refused_by_name(tmp_path, canonical_shards):
    with pytest.raises(shardkit.SampleError, match=r"sample 's0000000' is 2560 bytes, larger than max_pile_bytes \(3000\) on its own"):
        shardkit.pile(canonical_shards, tmp_path / "out", piles=2, max_pile_bytes=3000, quiet=True)


def test_empty_shards_and_shards_without_trailer(tmp_path, canonical_shards):
    """A shard of its end marker alone holds no sample; one without the marker reads up to its
    last member (tests/test_bad_inputs.py: with a warning). A 0-byte file is no tar: refused."""
    empty = str(tmp_path / "empty.tar")
    open(empty, "wb").close()
    with pytest.raises(shardkit.CorruptShardError, match=r"empty\.tar: an empty file \(0 bytes\)"):
        shardkit.pile([empty], tmp_path / "refused", piles=2, quiet=True)
    only_trailer = str(tmp_path / "trailer.tar")
    with open(only_trailer, "wb") as f:
        f.write(tarwrite.TRAILER)
    cut = str(tmp_path / "cut.tar")
    with open(cut, "wb") as f:
        f.write(read(canonical_shards[0])[: -len(tarwrite.TRAILER)])
    urls = [only_trailer, cut]
    m = shardkit.pile(urls, tmp_path / "fast", piles=2, quiet=True)
    assert m.samples == 30
    assert files(tmp_path / "fast") == re_encoded(tmp_path, urls, piles=2, quiet=True)


def test_parallel_merge_equals_serial_merge(tmp_path):
    """publish() assembles piles in threads; the files do not depend on how many."""
    samples = make_samples(300)
    outs = []
    for threads in (1, 4):
        out = tmp_path / f"t{threads}"
        shardkit.preprocess(
            range(30), lambda u: samples[u * 10 : u * 10 + 10], out, piles=7, workers=2, seed=5, buffer_size="4KiB", quiet=True
        )
        outs.append(files(out))
    assert outs[0] == outs[1]


def test_short_writes_are_finished(tmp_path, monkeypatch):
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: real(fd, [memoryview(bufs[0])[: max(1, len(bufs[0]) // 2)]]))
    sink = parts.PileSink(str(tmp_path / "parts"), 2, 1 << 20)
    chunks = [bytes([i]) * (100 + i) for i in range(40)]
    keys = np.array([f"{i:03d}".encode() for i in range(40)])
    sink.extend(0, np.array([i % 2 for i in range(40)]), chunks, np.array([len(c) for c in chunks]), keys)
    sink.flush()
    for p in range(2):
        data = read(sink.part(p))
        assert data == b"".join(chunks[p::2])
        assert sink.crcs[p] == manifest.checksum(data)


def test_memory_maps_are_released_in_bounded_numbers(tmp_path, monkeypatch):
    """Each pending map holds a file descriptor: the sink flushes after a few, whatever the buffer."""
    import mmap

    from shardkit import storage

    monkeypatch.setattr(storage.local, "MAP_MIN", 0)  # map even these small shards
    monkeypatch.setattr(parts, "MAX_MAPS", 3)
    flushes = []
    real = parts.PileSink.flush
    monkeypatch.setattr(parts.PileSink, "flush", lambda self: (flushes.append(self._maps), real(self)))
    urls = own_shards(tmp_path, 12)
    assert isinstance(storage.map_bytes(urls[0]), mmap.mmap)
    shardkit.pile(urls, tmp_path / "fast", piles=3, buffer_size="1GiB", quiet=True)
    assert flushes[:4] == [3, 3, 3, 3] and max(flushes) <= 3
    assert files(tmp_path / "fast") == re_encoded(tmp_path, urls, piles=3, quiet=True)


def test_map_bytes_reads_small_empty_and_missing_files(tmp_path):
    from shardkit import storage

    small, empty = tmp_path / "small.tar", tmp_path / "empty.tar"
    small.write_bytes(b"x" * 100)
    empty.write_bytes(b"")
    assert storage.map_bytes(str(small)) == b"x" * 100 and isinstance(storage.map_bytes(str(small)), bytes)
    assert storage.map_bytes(str(empty)) == b""
    with pytest.raises(shardkit.DatasetNotFoundError, match=r"missing.tar: no such file"):
        storage.map_bytes(str(tmp_path / "missing.tar"))


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_a_failure_while_merging_in_threads_leaves_no_dataset(tmp_path, monkeypatch, error):
    import threading

    from shardkit.dataset.lock import STAGING_PREFIX

    real = publish._assemble

    def failing(runs, dst, *rest):
        if dst.endswith("pile-000003.tar"):
            raise error("disk gone")
        return real(runs, dst, *rest)

    monkeypatch.setattr(publish, "_assemble", failing)
    out = tmp_path / "out"
    with pytest.raises(error):
        shardkit.pile(own_shards(tmp_path, 8), out, piles=6, workers=2, quiet=True)
    # the job does not wait for a merge thread inside a chunk's work (a zstd frame may take
    # seconds): each stops at its next chunk without writing, so let them get there first
    for thread in [t for t in threading.enumerate() if t.name.startswith("shardkit-merge")]:
        thread.join(timeout=30)
        assert not thread.is_alive(), f"{thread.name} did not stop at its next chunk"
    assert not manifest.is_dataset(str(out))
    assert not [e for e in os.listdir(out) if e.startswith(STAGING_PREFIX) or e.endswith(".tar")]


# ---- keys that repeat across or inside shards ---------------------------------------------------


def write_keys(path, keys) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key in keys:
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 2
            tf.addfile(info, io.BytesIO(b"hi"))
    return str(path)


@pytest.mark.parametrize("workers", [1, 2])
def test_shards_whose_keys_restart_are_refused_where_they_meet(tmp_path, workers):
    # the last sample of one shard and the first of the next share a key, next to each other in the pile
    urls = [write_keys(tmp_path / "a.tar", ["000000"]), write_keys(tmp_path / "b.tar", ["000000", "000001"])]
    out = tmp_path / "out"
    with pytest.raises(
        shardkit.SampleError,
        match=r"pile 0: sample 1 \(offset 1024, input unit 1 \('.*b\.tar'\)\) has the key '000000' of sample 0 "
        r"\(offset 0, input unit 0 \('.*a\.tar'\)\): keys must be unique across all inputs\..*key_prefix='unit'",
    ):
        shardkit.pile(urls, out, piles=1, workers=workers, quiet=True, key_prefix="none")
    assert not manifest.is_dataset(out)
    m = shardkit.pile(urls, out, piles=1, workers=workers, quiet=True, key_prefix="unit")
    assert m.samples == 3
    assert list(read_pile(os.path.join(out, m.piles[0].name), expected=m.piles[0]).keys) == ["a/000000", "b/000000", "b/000001"]
    with shardkit.loader(out, decode=False, shuffle=False) as loader:
        assert [s["__key__"] for s in loader] == ["a/000000", "b/000000", "b/000001"]


def test_key_prefix_output_equals_re_encoding_with_prefixed_keys(tmp_path):
    # keys restart at 000000 in every shard, as most writers number them
    urls = write_wds_shards(str(tmp_path), "src-{:06d}.tar", 3, lambda k, i: {"__key__": f"{i:06d}", "txt": f"{k}-{i}"} if i < 10 else None)
    m = shardkit.pile(urls, tmp_path / "fast", piles=3, seed=2, quiet=True, key_prefix="unit")

    def prefixed(url):
        stem = os.path.basename(url)[: -len(".tar")]
        return ({**s, "__key__": f"{stem}/{s['__key__']}"} for s in iter_shard(url))

    slow = shardkit.preprocess(urls, prefixed, tmp_path / "slow", piles=3, seed=2, quiet=True)
    assert m.samples == slow.samples == 30
    assert {k: v for k, v in files(tmp_path / "fast").items() if k.endswith(".tar")} == {
        k: v for k, v in files(tmp_path / "slow").items() if k.endswith(".tar")
    }


@pytest.mark.parametrize("seed", range(4))
def test_a_key_repeated_inside_a_shard_is_refused_wherever_its_samples_land(tmp_path, seed):
    # the members of "z" are not adjacent: a reader would hand out two half samples
    url = write_keys(tmp_path / "s.tar", ["z", "q", "z"])
    with pytest.raises(
        shardkit.CorruptShardError,
        match=r"input unit 0 \('.*s\.tar'\): .*s\.tar: sample 2 \(offset 2048\) has the key 'z' of sample 0 \(offset 0\): "
        r"keys must be unique, and the members of one sample adjacent",
    ):
        shardkit.pile([url], tmp_path / "out", piles=2, seed=seed, quiet=True)
    m = shardkit.pile([url], tmp_path / "out", piles=2, seed=seed, quiet=True, on_error="skip")
    assert m.skipped_units == 1 and m.samples == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_a_key_two_shards_share_is_refused_anywhere_in_a_pile(tmp_path, workers):
    # neither shard repeats a key, and "k" of b.tar lands far from "k" of a.tar: the pile would hold it twice
    urls = [write_keys(tmp_path / "a.tar", ["k", "l", "m"]), write_keys(tmp_path / "b.tar", ["n", "o", "k"])]
    with pytest.raises(
        shardkit.SampleError,
        match=r"pile 0: sample 5 \(offset 5120, input unit 1 \('.*b\.tar'\)\) has the key 'k' of sample 0 "
        r"\(offset 0, input unit 0 \('.*a\.tar'\)\): keys must be unique across all inputs",
    ):
        shardkit.pile(urls, tmp_path / "out", piles=1, workers=workers, buffer_size="1KiB", quiet=True)
    assert not manifest.is_dataset(tmp_path / "out")


def test_a_key_hash_collision_is_not_an_error(tmp_path, monkeypatch):
    from shardkit.tar import keys

    # every key hashes alike: every pair of samples is a candidate, and the keys decide
    monkeypatch.setattr(parts, "key_hashes", lambda k: np.zeros(len(k), dtype=np.uint64))
    monkeypatch.setattr(keys, "key_hashes", lambda k: np.zeros(len(k), dtype=np.uint64))
    urls = [write_keys(tmp_path / "a.tar", ["c", "a"]), write_keys(tmp_path / "b.tar", ["d", "b"])]
    m = shardkit.pile(urls, tmp_path / "out", piles=1, workers=2, quiet=True)
    assert read_pile(str(tmp_path / "out" / m.piles[0].name)).keys == ["c", "a", "d", "b"]


def test_names_that_are_not_utf8_are_piled_as_their_bytes(tmp_path):
    import webdataset as wds

    url = str(tmp_path / "latin1.tar")
    with tarfile.open(url, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        for name in ("caf\udce9.txt", "caf\udce9.cls", "na\u00efve.txt"):  # Latin-1 bytes, then UTF-8
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    m = shardkit.pile([url], tmp_path / "fast", piles=1, quiet=True)
    assert files(tmp_path / "fast") == re_encoded(tmp_path, [url], piles=1, quiet=True)
    pile = str(tmp_path / "fast" / m.piles[0].name)
    source = [(s["__key__"], sorted(s)) for s in wds.WebDataset(url, shardshuffle=False)]
    assert [(s["__key__"], sorted(s)) for s in wds.WebDataset(pile, shardshuffle=False)] == source
    assert read_pile(pile).keys == ["caf\udce9", "na\u00efve"] == [k for k, _ in source]


def test_a_key_with_a_control_character_in_a_shard_is_refused(tmp_path):
    url = write_keys(tmp_path / "s.tar", ["ok", "bad\x01key"])
    with pytest.raises(shardkit.SampleError, match="control character"):
        shardkit.pile([url], tmp_path / "out", piles=1, quiet=True)


def test_unit_prefix_is_the_file_stem():
    assert _raw.unit_prefix("/data/train-000003.tar") == "train-000003/"
    assert _raw.unit_prefix("s3://b/x/v1.2-shard.tar.gz") == "v1.2-shard/"
    with pytest.raises(shardkit.SampleError):
        _raw.unit_prefix("/data/__init__.tar")
    with pytest.raises(shardkit.ConfigError, match="key_prefix"):
        shardkit.pile(["x.tar"], "out", piles=1, key_prefix="shard")
