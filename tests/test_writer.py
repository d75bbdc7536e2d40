"""PileWriter: what goes in comes out (shardkit and webdataset agree), uniformly piled, safely."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from collections import Counter

import numpy as np
import pytest
from conftest import make_samples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image
from scipy import stats

import shardkit
from shardkit import manifest
from shardkit.dataset.lock import STAGING_PREFIX
from shardkit.errors import SampleError
from shardkit.loading.pile import read_pile
from shardkit.piles import router
from shardkit.piles.encode import encode_parts, encode_sample

# ---- helpers ---------------------------------------------------------------------------------


def write(out, samples, **kwargs) -> shardkit.Manifest:
    kwargs.setdefault("piles", 4)
    with shardkit.PileWriter(out, **kwargs) as w:
        for s in samples:
            w.write(s)
    assert w.manifest is not None
    return w.manifest


def read_raw(out) -> list[dict]:
    """Every sample of a dataset through shardkit's reader, checked against the manifest."""
    m = manifest.read(out)
    return [s for info in m.piles for s in read_pile(os.path.join(out, info.name), expected=info)]


def read_wds(out) -> list[dict]:
    import webdataset as wds

    urls = [os.path.join(out, p.name) for p in manifest.read(out).piles]
    return [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")} for s in wds.WebDataset(urls, shardshuffle=False)]


def files(out) -> dict[str, bytes]:
    return {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}


def canonical(ext: str, value) -> object:
    """A hashable form of a field value, equal for a value and its decoded bytes."""
    if isinstance(value, (bytes, memoryview)):
        value = bytes(value)
        if ext == "bin":
            return value
        value = shardkit.Codecs().decoder(ext)(value) if ext != "txt" else value.decode()
    if isinstance(value, Image.Image):
        value = np.asarray(value.convert("RGB"))
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if ext == "json":
        return json.dumps(value, sort_keys=True)
    return value


def as_multiset(samples) -> Counter:
    return Counter((s["__key__"], tuple(sorted((k, canonical(k, v)) for k, v in s.items() if k != "__key__"))) for s in samples)


# ---- round trip ------------------------------------------------------------------------------

key_part = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_ "), min_size=1, max_size=40)
reserved = re.compile(r"^__.*__$")  # WebDataset's metadata names: refused by the writer, tested below
keys = st.lists(key_part.filter(lambda p: not reserved.match(p)), min_size=1, max_size=4).map("/".join)  # long and non-ASCII too
small_image = hnp.arrays(np.uint8, st.tuples(st.integers(1, 6), st.integers(1, 6), st.just(3))).map(Image.fromarray)
FIELDS = {
    "bin": st.binary(max_size=1500),
    "txt": st.text(max_size=40),
    "cls": st.integers(-(10**9), 10**9),
    "json": st.dictionaries(st.text(max_size=6), st.none() | st.booleans() | st.integers() | st.text(max_size=8), max_size=4),
    "npy": hnp.arrays(st.sampled_from([np.uint8, np.int16, np.float32, np.float64]), hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)),
    "png": small_image,
}


@st.composite
def sample_lists(draw):
    # keys may repeat: two samples of one pile with one key must be refused
    pool = draw(st.lists(keys, min_size=1, max_size=12, unique=True))
    names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=12))
    samples = []
    for name in names:
        exts = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=len(FIELDS), unique=True))
        samples.append({"__key__": name, **{ext: draw(FIELDS[ext]) for ext in exts}})
    return samples


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(samples=sample_lists(), piles=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_round_trip_shardkit_and_webdataset_read_back_what_was_written(samples, piles, seed):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ds")
        clash = _first_repeat(samples, piles, seed)
        if clash is not None:  # readers would merge the two samples, or mix them up
            pile, later, earlier, key = clash
            with pytest.raises(
                SampleError, match=rf"pile {pile}: sample {later} .* has the key {re.escape(repr(key))} of {re.escape(earlier)} "
            ):
                write(out, samples, piles=piles, seed=seed)
            assert not manifest.is_dataset(out)
            return
        m = write(out, samples, piles=piles, seed=seed)
        assert m.samples == len(samples)
        assert len(m.piles) == piles
        assert set(m.fields) == {ext for s in samples for ext in s if ext != "__key__"}
        ours = read_raw(out)
        assert as_multiset(ours) == as_multiset(samples)
        theirs = read_wds(out)
        assert Counter(_raw_items(s) for s in theirs) == Counter(_raw_items(s) for s in ours)


def _first_repeat(samples: list[dict], piles: int, seed: int) -> tuple[int, int, str, str] | None:
    """(pile, position, the earlier sample as the message names it, key) of the repeat the writer
    reports, else None: write() refuses a key right after itself in a pile; close() the repeat
    whose second place comes first in pile order, in one pile or in two."""
    route = router.PileRouter(piles=piles, seed=seed)
    held: list[list[str]] = [[] for _ in range(piles)]
    for s in samples:
        p = route.next()
        if held[p] and held[p][-1] == s["__key__"]:
            return p, len(held[p]), f"sample {len(held[p]) - 1}", s["__key__"]
        held[p].append(s["__key__"])
    places: dict[str, list[tuple[int, int]]] = {}
    for p, keys in enumerate(held):
        for i, key in enumerate(keys):
            places.setdefault(key, []).append((p, i))
    repeats = sorted((at[1], at[0], key) for key, at in places.items() if len(at) > 1)
    if not repeats:
        return None
    (pile, later), (first_pile, earlier), key = repeats[0]
    return pile, later, (f"sample {earlier}" if first_pile == pile else f"pile {first_pile}'s sample {earlier}"), key


def test_adjacent_duplicate_key_is_refused_at_once_and_leaves_no_dataset(tmp_path):
    out = str(tmp_path / "ds")
    w = shardkit.PileWriter(out, piles=1)
    w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(
        SampleError, match=r"pile 0: sample 1 \(offset 1024\) has the key 'a' of sample 0 \(offset 0\): keys must be unique"
    ):
        w.write({"__key__": "a", "cls": 1})
    assert w.close().samples == 1  # refused before anything changed
    shutil.rmtree(out)
    with pytest.raises(SampleError), shardkit.PileWriter(out, piles=1) as w:
        for s in ({"__key__": "a", "txt": "x"}, {"__key__": "a", "cls": 1}):
            w.write(s)
    assert not manifest.is_dataset(out)


def test_a_repeated_key_anywhere_in_a_pile_is_refused_on_close(tmp_path):
    out = str(tmp_path / "ds")
    samples = [{"__key__": "a", "txt": "1"}, {"__key__": "b", "txt": "2"}, {"__key__": "a", "txt": "3"}]
    w = shardkit.PileWriter(out, piles=1, buffer_size=1024)  # the samples reach the part file in two flushes
    for s in samples:
        w.write(s)
    with pytest.raises(
        SampleError, match=r"pile 0: sample 2 \(offset 2048\) has the key 'a' of sample 0 \(offset 0\): keys must be unique"
    ):
        w.close()
    assert not os.path.exists(out)


def test_one_key_file_holds_every_piles_hashes_and_a_repeat_is_found_in_a_pile_or_across_two(tmp_path):
    from shardkit.piles import parts, unique_keys

    def sink_with(extra):
        sink = parts.PileSink(str(tmp_path / f"p-{extra}"), 3, 1 << 30)

        def put(pile, key):
            pieces, size, _ = encode_parts({"__key__": key, "txt": key})
            sink.add(pile, pieces, size, 0, key)

        for flush in range(3):
            for pile in range(3):
                put(pile, f"k{flush}-p{pile}")
            sink.flush()
        if extra:
            put(2, extra)  # pile 2's fourth sample, two flushes after the key it repeats
            sink.flush()
        return sink

    sink = sink_with("")
    unique_keys.check_sink(sink)  # nine keys, each once
    assert sorted(os.listdir(sink.directory)) == ["000000.part", "000001.part", "000002.part", "keys"]
    assert list(sink.key_runs[0]) == [0, 1, 3, 1, 6, 1] and list(sink.key_runs[2]) == [2, 1, 5, 1, 8, 1]
    with pytest.raises(SampleError, match=r"pile 2: sample 3 \(offset 3072\) has the key 'k0-p2' of sample 0 \(offset 0\): keys must"):
        unique_keys.check_sink(sink_with("k0-p2"))
    with pytest.raises(SampleError, match=r"pile 2: sample 3 \(offset 3072\) has the key 'k1-p0' of pile 0's sample 1 \(offset 1024\)"):
        unique_keys.check_sink(sink_with("k1-p0"))


def test_a_key_in_two_piles_of_a_writer_is_refused_and_nothing_is_published(tmp_path):
    out = str(tmp_path / "ds")
    w = shardkit.PileWriter(out, piles=64, seed=0)
    for i in range(200):
        w.write({"__key__": f"k{i}", "txt": "x"})
    w.write({"__key__": "k7", "txt": "again"})
    with pytest.raises(SampleError, match=r"has the key 'k7' of (pile \d+'s )?sample \d+ \(offset \d+\): keys must be unique"):
        w.close()
    assert not manifest.is_dataset(out)


@pytest.mark.parametrize("memory", [1 << 30, 64, 8])
def test_repeated_hashes_are_the_same_at_once_or_in_buckets(tmp_path, monkeypatch, memory):
    from shardkit.piles import parts, unique_keys

    monkeypatch.setattr(unique_keys, "CHECK_MEMORY", memory)  # the floor of the budget below

    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**64, size=500, dtype=np.uint64)
    values[[10, 300, 499]] = values[[20, 301, 0]]  # three values twice (one in two key files)
    values[[50, 51]] = values[40]  # and one three times
    files = []
    for k, part in enumerate((values[:250], values[250:])):
        path = tmp_path / f"keys{k}"
        part.astype("<u8").tofile(path)
        # runs out of order and in pieces, as flushes of several piles leave them
        files.append(parts.Hashes(str(path), np.array([[100, 150], [0, 60], [60, 40]], dtype=np.int64)))
    found, times = unique_keys.repeated_hashes(files, 0, str(tmp_path))
    unique, counts = np.unique(values, return_counts=True)
    assert found.tolist() == unique[counts > 1].tolist() and len(found) == 4
    assert times.tolist() == counts[counts > 1].tolist() and sorted(times.tolist()) == [2, 2, 2, 3]
    assert sorted(os.listdir(tmp_path)) == ["keys0", "keys1"]  # the bucket files are gone


@given(st.text(alphabet="aZ09-_./\u00e9", max_size=12))
def test_a_key_the_quick_check_lets_through_passes_the_full_check(key):
    from shardkit.piles import encode

    if encode._PLAIN.fullmatch(key):
        assert encode._check_key(key) == key


def test_keys_that_are_alike_only_in_their_hash_are_written(tmp_path, monkeypatch):
    from shardkit.piles import parts

    monkeypatch.setattr(parts, "key_hashes", lambda k: np.zeros(len(k), dtype=np.uint64))
    samples = [{"__key__": k, "txt": k} for k in ("a", "b", "c", "d")]
    write(str(tmp_path / "ds"), samples, piles=1)
    assert [s["__key__"] for s in read_raw(str(tmp_path / "ds"))] == ["a", "b", "c", "d"]


def test_a_key_with_bytes_that_are_not_utf8_round_trips(tmp_path):
    # a key made from a Latin-1 file name by os.listdir or tarfile: the byte 0xe9 as '\udce9'
    samples = [{"__key__": "caf\udce9", "txt": "x", "b\udcffn": b"1"}, {"__key__": "caf\u00e9", "txt": "y"}]
    out = str(tmp_path / "ds")
    write(out, samples, piles=1)
    assert [(s["__key__"], sorted(s)) for s in read_raw(out)] == [(s["__key__"], sorted(s)) for s in samples]
    assert [s["__key__"] for s in read_wds(out)] == ["caf\udce9", "caf\u00e9"]
    assert shardkit.verify(out, quiet=True) == []


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"__key__": "a\ud800", "txt": "x"}, r"sample key 'a\\ud800' holds '\\ud800' at position 1, a surrogate that is no byte"),
        ({"__key__": "a", "t\udbffxt": "x"}, r"sample 'a': field name 't\\udbffxt' holds '\\udbff' at position 1"),
    ],
)
def test_a_surrogate_that_is_no_escaped_byte_is_refused(tmp_path, sample, message):
    with pytest.raises(SampleError, match=message), shardkit.PileWriter(tmp_path / "ds", piles=1) as w:
        w.write(sample)
    assert not manifest.is_dataset(tmp_path / "ds")


@pytest.mark.parametrize("key", ["a\x00b", "line\nbreak", "tab\there", "del\x7f", "c1\x85", "\r"])
def test_keys_with_control_characters_are_refused(key):
    with pytest.raises(SampleError, match="control character"):
        encode_sample({"__key__": key, "txt": "x"})


def _raw_items(sample: dict) -> tuple:
    return tuple(sorted((k, bytes(v) if k != "__key__" else v) for k, v in sample.items()))


def test_piles_are_plain_tars_with_fixed_metadata(tmp_path):
    import tarfile

    out = str(tmp_path / "ds")
    write(out, make_samples(20), piles=2)
    for info in manifest.read(out).piles:
        with tarfile.open(os.path.join(out, info.name)) as tf:
            members = tf.getmembers()
        assert len(members) == 2 * info.samples
        assert {(m.mtime, m.uid, m.gid, m.mode, m.uname, m.type) for m in members} == {(0, 0, 0, 0o644, "", tarfile.REGTYPE)}


# ---- determinism and uniformity --------------------------------------------------------------


def test_same_seed_gives_byte_identical_piles(tmp_path):
    samples = make_samples(300)
    write(tmp_path / "a", samples, piles=7, seed=11)
    write(tmp_path / "b", samples, piles=7, seed=11)
    assert files(tmp_path / "a") == files(tmp_path / "b")


def test_different_seeds_give_different_piles(tmp_path):
    samples = make_samples(300)
    a = write(tmp_path / "a", samples, piles=7, seed=1)
    b = write(tmp_path / "b", samples, piles=7, seed=2)
    assert [p.checksum for p in a.piles] != [p.checksum for p in b.piles]
    assert a.samples == b.samples == 300


def test_pile_assignment_is_uniform_and_blind_to_the_data(tmp_path):
    n, piles, classes = 16_000, 16, 8
    samples = [{"__key__": f"s{i:06d}", "cls": i * classes // n} for i in range(n)]  # class-sorted input
    m = write(tmp_path / "ds", samples, piles=piles, seed=20240601, buffer_size="1MiB")
    counts = [p.samples for p in m.piles]
    assert stats.chisquare(counts).pvalue > 1e-4
    # the same holds within every class: the pile does not depend on the sample
    table = np.zeros((piles, classes), dtype=np.int64)
    for p, info in enumerate(m.piles):
        pile = read_pile(os.path.join(tmp_path, "ds", info.name))
        for i in range(len(pile)):
            table[p, int(pile.sample(i)["cls"])] += 1
    assert stats.chi2_contingency(table).pvalue > 1e-4


# ---- oversized piles -------------------------------------------------------------------------


def test_oversized_piles_are_split_into_random_sub_piles(tmp_path):
    samples = make_samples(400, size=300)  # ~1.5 KiB per sample in the tar
    limit = 40_000
    m = write(tmp_path / "a", samples, piles=4, seed=5, max_pile_bytes=limit)
    assert m.split_piles == 4  # each pile holds ~150 KB: all four split
    assert len(m.piles) > 4
    for info in m.piles:
        assert info.bytes == os.path.getsize(tmp_path / "a" / info.name) <= limit
        assert info.name.startswith("pile-") and info.name.count("-") >= 2
    assert sorted(s["__key__"] for s in read_raw(tmp_path / "a")) == [s["__key__"] for s in samples]
    assert m.samples == 400
    again = write(tmp_path / "b", samples, piles=4, seed=5, max_pile_bytes=limit)
    assert again == m and files(tmp_path / "a") == files(tmp_path / "b")


def test_a_sample_larger_than_max_pile_bytes_is_refused(tmp_path):
    with pytest.raises(shardkit.SampleError, match=r"sample 'big' is \d+ bytes, larger than max_pile_bytes \(4096\) on its own"):
        write(tmp_path / "ds", [{"__key__": "big", "bin": bytes(5000)}], max_pile_bytes="4KiB")
    assert not os.path.exists(tmp_path / "ds" / "shardkit.json")


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"__key__": "a.b", "txt": "x"}, r"sample key 'a.b' has a dot in its file name"),
        ({"__key__": "a/../b", "txt": "x"}, r"sample key 'a/../b': no leading '/', empty or '..' path components"),
        ({"__key__": "/abs", "txt": "x"}, r"sample key '/abs': no leading '/'"),
        ({"__key__": "a/__meta__/b", "txt": "x"}, r"sample key 'a/__meta__/b': a path component like '__name__' is reserved"),
        ({"__key__": "", "txt": "x"}, r"sample key must be a non-empty str, got ''"),
        ({"__key__": 7, "txt": "x"}, r"sample key must be a non-empty str, got 7"),
        ({"txt": "x"}, r"sample has no '__key__' \(fields: \['txt'\]\)"),
        ({"__key__": "k", "jpg": b"1", ".jpg": b"2"}, r"sample 'k': two fields with extension 'jpg'"),
        ({"__key__": "k", "foo": {1, 2}}, r"sample 'k': field 'foo': no encoder for set values in a .foo field"),
        ({"__key__": "k", "cls": 1.5}, r"sample 'k': field 'cls': expected an int"),
        ({"__key__": "k"}, r"sample 'k' has no fields besides its key"),
    ],
)
def test_bad_samples_are_refused_with_a_clear_message(tmp_path, sample, message):
    with shardkit.PileWriter(tmp_path / "ds", piles=2) as w:
        w.write({"__key__": "good", "txt": "ok"})
        with pytest.raises(shardkit.SampleError, match=message):
            w.write(sample)
        w.write({"__key__": "good2", "txt": "ok"})  # the writer is still usable
    assert sorted(s["__key__"] for s in read_raw(tmp_path / "ds")) == ["good", "good2"]


def test_an_existing_dataset_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "ds"
    write(out, make_samples(50), piles=4)
    before = files(out)
    with pytest.raises(shardkit.DatasetExistsError, match=r"ds: already holds a shardkit dataset \(shardkit.json\); pass overwrite=True"):
        shardkit.PileWriter(out, piles=2)
    assert files(out) == before
    m = write(out, make_samples(10, seed=1), piles=2, overwrite=True)
    # the new piles came in beside the old ones under names of their own; the old ones went after
    assert sorted(os.listdir(out)) == ["pile-000000.v1.tar", "pile-000001.v1.tar", "shardkit.json"]
    assert manifest.read(out) == m and m.samples == 10
    again = write(out, make_samples(10, seed=2), piles=2, overwrite=True)  # the plain names are free again
    assert sorted(os.listdir(out)) == ["pile-000000.tar", "pile-000001.tar", "shardkit.json"] and again.samples == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"piles": 0}, "piles: expected an integer >= 1, got 0"),
        ({"piles": 2, "seed": -1}, "seed"),
        (
            {"piles": 2, "max_pile_bytes": 512},
            r"max_pile_bytes: expected at least 1536 bytes \(a member header and the end-of-archive marker\), got 512",
        ),
        ({"piles": 2, "max_pile_bytes": "1KiB"}, r"max_pile_bytes: expected at least 1536 bytes .*, got 1024"),
    ],
)
def test_bad_options(tmp_path, kwargs, message):
    with pytest.raises(shardkit.ConfigError, match=message):
        shardkit.PileWriter(tmp_path / "ds", **kwargs)


def test_an_empty_dataset_with_the_smallest_max_pile_bytes_is_published(tmp_path):
    with shardkit.PileWriter(tmp_path / "ds", piles=2, max_pile_bytes=1536) as w:
        pass
    m = w.manifest
    assert m is not None and m.samples == 0 and m.split_piles == 0 and [p.bytes for p in m.piles] == [1024, 1024]


def test_stray_pile_files_without_a_manifest_are_refused_and_kept(tmp_path):
    out = tmp_path / "u"
    out.mkdir()
    (out / "pile-000009.tar").write_bytes(b"not ours")
    with pytest.raises(shardkit.DatasetExistsError, match=r"u: holds pile-000009.tar but no shardkit.json.*overwrite=True"):
        shardkit.PileWriter(out, piles=2)
    assert os.listdir(out) == ["pile-000009.tar"]  # refused before any work: no staging either
    write(out, [{"__key__": "a", "txt": "x"}], piles=2, overwrite=True)
    assert (out / "pile-000009.tar").read_bytes() == b"not ours"  # no manifest listed it
    assert sorted(os.listdir(out)) == ["pile-000000.tar", "pile-000001.tar", "pile-000009.tar", "shardkit.json"]


def test_overwrite_deletes_only_the_files_of_the_old_manifest(tmp_path):
    out = tmp_path / "ds"
    write(out, make_samples(20), piles=4)
    (out / "pile-notes.tar").write_bytes(b"kept")
    (out / "readme.txt").write_bytes(b"kept")
    m = write(out, make_samples(5, seed=1), piles=2, overwrite=True)
    assert sorted(os.listdir(out)) == ["pile-000000.v1.tar", "pile-000001.v1.tar", "pile-notes.tar", "readme.txt", "shardkit.json"]
    assert manifest.read(out) == m
    (out / "shardkit.json").write_text("{broken")  # an unreadable old manifest: its files stay, the new dataset is whole
    m = write(out, make_samples(5, seed=2), piles=1, overwrite=True)
    assert manifest.read(out) == m and m.piles[0].name == "pile-000000.tar" and (out / "pile-000001.v1.tar").exists()


def test_close_after_a_failed_close_raises_a_clear_error(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("shardkit.piles.writer.publish", fail)
    w = shardkit.PileWriter(tmp_path / "ds", piles=2)
    w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(OSError, match="disk full"):
        w.close()
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"PileWriter.close\(\): nothing was published \(an earlier close\(\) failed"):
            w.close()
    aborted = shardkit.PileWriter(tmp_path / "ds2", piles=2)
    aborted.abort()
    with pytest.raises(RuntimeError, match="abort"):
        aborted.close()


def test_an_exception_in_the_with_block_leaves_no_dataset(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(KeyError), shardkit.PileWriter(out, piles=3, buffer_size=1000) as w:
        for s in make_samples(100):  # enough to flush part files to disk
            w.write(s)
        raise KeyError("boom")
    assert not out.exists()  # the folder it made goes again


def test_an_interrupted_overwrite_keeps_the_old_dataset(tmp_path):
    out = tmp_path / "ds"
    old = write(out, make_samples(30), piles=3)
    with pytest.raises(KeyboardInterrupt), shardkit.PileWriter(out, piles=5, overwrite=True) as w:
        w.write({"__key__": "new", "txt": "x"})
        raise KeyboardInterrupt
    assert manifest.read(out) == old
    assert not [e for e in os.listdir(out) if e.startswith(STAGING_PREFIX)]


def test_use_after_close_raises(tmp_path):
    w = shardkit.PileWriter(tmp_path / "ds", piles=2)
    w.write({"__key__": "a", "txt": "x"})
    m = w.close()
    assert w.close() == m  # idempotent
    with pytest.raises(RuntimeError, match=r"PileWriter.write\(\) called after close\(\); open a new writer"):
        w.write({"__key__": "b", "txt": "x"})


def test_numpy_images_and_pil_images_encode_to_the_same_png(tmp_path):
    array = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    write(tmp_path / "ds", [{"__key__": "a", "png": array}, {"__key__": "b", "png": Image.fromarray(array)}], piles=1)
    got = {s["__key__"]: s["png"] for s in read_raw(tmp_path / "ds")}
    assert got["a"] == got["b"]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(got["a"]))), array)


def test_a_repeated_key_is_refused_before_a_split_could_make_it_adjacent(tmp_path):
    out = str(tmp_path / "ds")
    samples = [{"__key__": k, "bin": b"x" * 1000} for k in ("a", "b", "a", "c")]
    # one pile of 4 samples of 2048 bytes, capacity floor(0.9 * 5000 * 4 / 8192) = 2: split at
    # random; find a seed whose final sub-piles would hold both "a" side by side (the "b" elsewhere)
    for seed in range(200):
        leaves = [chosen.tolist() for _, chosen in router.sub_piles(4, capacity=2, seed=seed, trail=(0,))]
        if [0, 2] in leaves:
            break
    with pytest.raises(SampleError, match=r"pile 0: sample 2 \(offset 3072\) has the key 'a' of sample 0 \(offset 0\)"):
        write(out, samples, piles=1, seed=seed, max_pile_bytes=5000)
    assert not manifest.is_dataset(out)


# ---- pile counts that deserve a word ---------------------------------------------------------


def test_asking_for_very_many_piles_warns_before_writing(tmp_path, caplog):
    out = str(tmp_path / "many")
    with caplog.at_level("WARNING", logger="shardkit"):
        writer = shardkit.PileWriter(out, piles=100_001)
    writer.abort()
    (record,) = caplog.records
    assert record.name == "shardkit.piles.writer"
    assert record.getMessage().startswith(f"PileWriter({out!r}): piles=100,001 writes 100,001 pile files")
    assert "s + 6 sqrt(s)" in record.getMessage() and "Choosing M" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardkit"):
        shardkit.PileWriter(str(tmp_path / "enough"), piles=100_000).abort()
    assert caplog.records == []


def test_closing_with_more_piles_than_samples_warns(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="shardkit"), shardkit.PileWriter(str(tmp_path / "sparse"), piles=50) as w:
        for s in make_samples(3):
            w.write(s)
    (record,) = caplog.records
    empty = sum(p.samples == 0 for p in w.manifest.piles)
    assert empty >= 47 and f"3 samples in 50 piles: {empty} piles are empty" in record.getMessage()
    assert "fit in piles=1 for a loader given 1.0 GiB" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardkit"), shardkit.PileWriter(str(tmp_path / "dense"), piles=3) as w:
        for s in make_samples(3):
            w.write(s)
    assert caplog.records == []


@pytest.mark.parametrize("ending", ["close", "abort"])
def test_flushes_are_written_back_ahead_of_the_sync_and_the_thread_is_gone_at_the_end(tmp_path, monkeypatch, ending):
    import threading

    from shardkit.storage import local

    real, synced = local._syncfs(), []
    if real is None:
        pytest.skip("syncfs is a Linux call: PileWriter writes nothing back ahead elsewhere")
    monkeypatch.setattr(local, "_syncfs", lambda: lambda fd: synced.append(fd) or real(fd))
    w = shardkit.PileWriter(str(tmp_path / "ds"), piles=4, buffer_size=64 << 10)
    for i in range(100):
        w.write({"__key__": f"k{i:04d}", "bin": bytes(3000)})
    if ending == "close":
        assert w.close().samples == 100
    else:
        w.abort()
    # a flush started a writeback (one runs at a time); close()'s sync before publishing comes on top
    assert len(synced) >= (2 if ending == "close" else 1)
    assert "shardkit-writeback" not in [t.name for t in threading.enumerate()]


def test_an_output_in_an_object_store_is_not_written_back(monkeypatch):
    import uuid

    fsspec = pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")
    from shardkit.storage import local

    monkeypatch.setattr(local.Writeback, "start", lambda self: pytest.fail("a remote output's staging was written back"))
    root = f"memory://bucket-{uuid.uuid4().hex}"
    try:
        with shardkit.PileWriter(f"{root}/ds", piles=2, buffer_size=4 << 10) as w:
            for i in range(20):
                w.write({"__key__": f"k{i:04d}", "bin": bytes(1000)})
        assert w.manifest is not None and w.manifest.samples == 20
    finally:
        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def _failing_once(monkeypatch, error: int) -> list[int]:
    """syncfs as the kernel reports a write error: -1 with ``error`` to the first caller, then 0."""
    import ctypes

    from shardkit.storage import local

    calls: list[int] = []

    def syncfs(fd: int) -> int:
        calls.append(fd)
        if len(calls) == 1:
            ctypes.set_errno(error)
            return -1
        return 0

    monkeypatch.setattr(local, "_syncfs", lambda: syncfs)
    return calls


def test_a_write_error_only_the_writeback_saw_fails_the_close_and_publishes_nothing(tmp_path, monkeypatch):
    import errno

    from shardkit.errors import StorageError

    calls = _failing_once(monkeypatch, errno.EIO)
    out = tmp_path / "ds"
    w = shardkit.PileWriter(str(out), piles=3, buffer_size=16 << 10)
    for i in range(40):
        w.write({"__key__": f"k{i:04d}", "bin": bytes(2000)})
    with pytest.raises(StorageError, match=r"\.shardkit-staging.*flush to disk"):
        w.close()
    assert calls and not (out / "shardkit.json").exists()
    assert not out.exists()  # nothing left: the folder it made goes too
    with shardkit.PileWriter(str(out), piles=3) as again:  # the lock is free: a rerun works
        again.write({"__key__": "a", "bin": b"x"})


def test_abort_drops_a_writeback_error_and_releases_everything_when_closing_the_parts_fails(tmp_path, monkeypatch):
    import errno

    from shardkit.piles import gather

    _failing_once(monkeypatch, errno.EIO)
    out = tmp_path / "ds"
    w = shardkit.PileWriter(str(out), piles=3, buffer_size=16 << 10)
    for i in range(40):
        w.write({"__key__": f"k{i:04d}", "bin": bytes(2000)})
    real_close = gather.SampleSink.close

    def broken(self: gather.SampleSink) -> None:
        real_close(self)
        raise OSError(errno.EIO, "close failed")

    monkeypatch.setattr(gather.SampleSink, "close", broken)
    with pytest.raises(OSError, match="close failed"):
        w.abort()
    monkeypatch.setattr(gather.SampleSink, "close", real_close)
    assert "shardkit-writeback" not in [t.name for t in __import__("threading").enumerate()]
    assert not out.exists()  # nothing left: the folder it made goes too
    shardkit.PileWriter(str(out), piles=3).abort()  # the lock was let go


def test_bad_codecs_are_refused_before_the_output_is_touched(tmp_path):
    from shardkit.errors import ConfigError

    out = tmp_path / "ds"
    with pytest.raises(ConfigError):
        shardkit.PileWriter(str(out), piles=4, codecs={"x": 5})
    assert not out.exists()


def test_a_refused_sample_is_named_by_its_place_in_the_writes(tmp_path):
    with shardkit.PileWriter(tmp_path / "ds", piles=2, seed=0) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "txt": "x"})
        with pytest.raises(
            shardkit.SampleError, match=r"^PileWriter.write: sample 3 \(counting from 0; not written\): sample key 'bad\\x01'"
        ):
            w.write({"__key__": "bad\x01", "txt": "x"})
        w.write({"__key__": "k3", "txt": "x"})  # the writer goes on
        with pytest.raises(shardkit.SampleError, match=r"^PileWriter.write: sample 5 \(counting from 0; not written\): "):
            w.write({"__key__": "k5", "txt": "x", "no_encoder": object()})  # counted as the calls are, refused or not
    assert shardkit.info(tmp_path / "ds").samples == 4


def test_a_sample_the_piles_refuse_is_named_by_its_place_too(tmp_path):
    w = shardkit.PileWriter(tmp_path / "ds", piles=1, seed=0)
    w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(shardkit.SampleError, match=r"^PileWriter.write: sample 1 \(counting from 0; not written\): pile 0: .*the key 'a'"):
        w.write({"__key__": "a", "txt": "y"})
    with pytest.raises(shardkit.SampleError, match=r"^PileWriter.write: sample 2 "):
        w.write({"__key__": "bad\x01", "txt": "x"})
    w.abort()
