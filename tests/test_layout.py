"""The array index of tar shards agrees with the member-by-member walk, and canonical headers are exact."""

from __future__ import annotations

import io
import re
import tarfile

import numpy as np
import pytest
import reference_tar
from hypothesis import given, settings
from hypothesis import strategies as st

import shardkit
from shardkit.tar import index as tarindex
from shardkit.tar import walk as tarwalk
from shardkit.tar import write as tarwrite


def archive(members: list[tuple[str, bytes]]) -> bytes:
    return b"".join(tarwrite.member(name, data) for name, data in members) + tarwrite.TRAILER


def as_tuples(layout: tarindex.Layout) -> list[tuple[str, int, int]]:
    return list(zip(layout.all_names(), layout.heads.tolist(), layout.sizes.tolist(), strict=True))


def walked(buf: bytes) -> list[tuple[str, int, int]]:
    m = tarwalk.walk(buf, "x")
    return [(n, o - 512, s) for n, o, s in zip(m.names, m.offsets, m.sizes, strict=True)]


names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_./"), min_size=1, max_size=60).filter(
    lambda n: not n.startswith("/") and ".." not in n.split("/")
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(names, st.binary(max_size=1500)), max_size=12))
def test_vectorized_index_agrees_with_the_walk(members):
    buf = archive(members)
    layout = tarindex.index(buf, "x")
    assert as_tuples(layout) == walked(buf)
    plain = all(n.isascii() and len(n) <= 100 for n, _ in members)  # else member() adds pax headers
    assert layout.plain == plain
    if plain:
        assert layout.names is None  # the vectorized path took it
        assert layout.canonical.all()


def test_data_that_looks_like_headers_is_not_taken_for_them():
    inner = archive([("fake.txt", b"x" * 700), ("fake.bin", b"y")])  # a tar inside a member
    buf = archive([("a.tar", inner), ("b.txt", b"after")])
    layout = tarindex.index(buf, "x")
    assert layout.names is None and as_tuples(layout) == walked(buf)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_archives_of_other_writers_index_like_the_walk(fmt):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name in ["a.txt", "dir/b.cls", "c" * 60 + "/" + "d" * 50 + ".bin", "é.txt"]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uname = 3, 1234.5, "someone"
            tf.addfile(info, io.BytesIO(b"abc"))
    buf = out.getvalue()
    layout = tarindex.index(buf, "x")
    assert as_tuples(layout) == walked(buf)
    assert not layout.canonical.any()  # owners, modes and mtimes differ from shardkit's


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:700], "runs past the end of the file"),
        (lambda b: b[: 512 * 3 + 100], "truncated inside a header"),
        (lambda b: b[:148] + b"0000000\x00" + b[156:], "header checksum"),
        (lambda b: b[:156] + b"2" + b[157:], "expected a regular file, found a symlink"),
    ],
)
def test_damage_raises_what_the_walk_raises(damage, message):
    buf = damage(archive([("a.txt", b"x" * 600), ("b.txt", b"y")]))
    with pytest.raises(shardkit.CorruptShardError, match=message):
        tarwalk.walk(buf, "x")
    with pytest.raises(shardkit.CorruptShardError, match=message):
        tarindex.index(buf, "x")


def test_unsafe_names_are_refused_as_the_walk_refuses_them():
    for name in ["../evil.txt", "a/../../b.txt", "/abs.txt"]:
        buf = tarwrite._header(name.encode(), 1, b"0") + b"x".ljust(512, b"\0") + tarwrite.TRAILER
        with pytest.raises(shardkit.CorruptShardError, match="unsafe member name"):
            tarindex.index(buf, "x")


def test_grouping_matches_webdataset_rules_and_refuses_duplicates():
    buf = archive([("a/k1.jpg", b"1"), ("a/k1.cls", b"2"), ("k1.x.y", b"3"), ("k2", b"4"), ("k2.txt", b"5")])
    layout = tarindex.index(buf, "x")
    assert layout.samples().tolist() == [0, 2, 3, 5]
    members = tarwalk.walk(buf, "x")
    assert layout.sample_bounds(layout.samples()).tolist() == reference_tar.sample_spans(members, reference_tar.group(members, "x")[1])
    duplicate = archive([("k.txt", b"1"), ("k.txt", b"2")])
    with pytest.raises(shardkit.CorruptShardError, match=r"sample 'k' already has a 'txt' member"):
        tarindex.index(duplicate, "x").samples()


def test_vectorized_headers_equal_the_member_writer():
    rng = np.random.default_rng(0)
    rows = np.zeros((50, 100), dtype=np.uint8)
    names, sizes = [], rng.integers(0, 8**11, size=50)
    for i in range(50):
        name = bytes(rng.integers(33, 127, size=int(rng.integers(1, 101))).tolist())
        rows[i, : len(name)] = np.frombuffer(name, dtype=np.uint8)
        names.append(name)
    built = tarwrite.headers(rows, sizes)
    assert [built[i].tobytes() for i in range(50)] == [tarwrite._header(n, int(s), b"0") for n, s in zip(names, sizes, strict=True)]
    starts = tarwrite.header_starts(rows, sizes)  # the varying start of each, before a tail they share
    assert [starts[i].tobytes() + tarwrite.HEADER_TAIL for i in range(50)] == [built[i].tobytes() for i in range(50)]
    assert tarwrite.canonical(built, rows, sizes).all()
    for _ in range(300):  # any single changed byte makes a header non-canonical
        i, j = int(rng.integers(50)), int(rng.integers(512))
        changed = built.copy()
        changed[i, j] ^= 1 + int(rng.integers(255))
        found = tarwrite.canonical(changed, rows, sizes)
        assert not found[i] and found.sum() == 49


def pax_member(records: bytes, name: str, data: bytes) -> bytes:
    """A pax header carrying ``records``, then a plain member (what tarfile writes for a float mtime)."""
    return (
        tarwrite._header(tarwrite._PAX_NAME, len(records), b"x") + records + tarwrite._padding(len(records)) + tarwrite.member(name, data)
    )


def test_webdataset_shards_are_indexed_without_the_walk(tmp_path):
    from conftest import write_wds_shards

    [path] = write_wds_shards(tmp_path, "w{}.tar", 1, lambda k, i: {"__key__": f"k{i}", "txt": "x" * i, "cls": b"1"} if i < 40 else None)
    with open(path, "rb") as f:
        buf = f.read()
    layout = tarindex.index(buf, "x")
    assert layout.names is None and not layout.plain  # vectorized, but not copyable as it is
    assert as_tuples(layout) == walked(buf)


rec = tarwrite._pax_record


@pytest.mark.parametrize(
    "records",
    [
        rec("path", "other.txt"),  # renames the member: only the walk knows
        rec("size", "99"),  # resizes it
        rec("mtime", "1.5") + rec("path", "other.txt"),  # two records, one of them a path
    ],
)
def test_pax_records_that_rename_or_resize_go_to_the_walk(records):
    buf = pax_member(records, "a.txt", b"abc") + tarwrite.member("b.txt", b"d") + tarwrite.TRAILER
    assert tarindex._plain(buf, "x") is None


@pytest.mark.parametrize(
    "records",
    [
        rec("path", "other.txt"),
        rec("size", "3"),
        b"30 mtime=1.5\n",  # a wrong length the walk's parser tolerates
        b"x mtime=1.5\n",  # a length that is not a number
        b"5 mtime=1.5\n",  # a length that cuts the record
        rec("mtime", "1.5")[:-1],  # no newline at the end
        rec("mtï", "1"),  # a non-ASCII keyword
    ],
)
def test_any_pax_header_gives_what_the_walk_gives(records):
    buf = pax_member(records, "a.txt", b"abc") + tarwrite.member("b.txt", b"d") + tarwrite.TRAILER
    try:
        expected = walked(buf)
    except shardkit.CorruptShardError as e:
        with pytest.raises(shardkit.CorruptShardError, match=re.escape(str(e).split(": ", 1)[1])):
            tarindex.index(buf, "x")
    else:
        assert as_tuples(tarindex.index(buf, "x")) == expected


def test_harmless_pax_records_are_skipped_like_the_walk_skips_them():
    first = rec("mtime", "1.5") + rec("uname", "someone")
    buf = pax_member(first, "a.txt", b"abc") + pax_member(rec("mtime", "2.5"), "a.cls", b"1") + tarwrite.TRAILER
    layout = tarindex._plain(buf, "x")
    assert layout is not None and as_tuples(layout) == walked(buf)


def test_sample_bounds_of_pax_shards_match_the_walk(tmp_path):
    from conftest import write_wds_shards

    [path] = write_wds_shards(tmp_path, "w{}.tar", 1, lambda k, i: {"__key__": f"k{i}", "txt": "x" * i, "cls": b"1"} if i < 9 else None)
    with open(path, "rb") as f:
        buf = f.read()
    layout = tarindex.index(buf, "x")
    members = tarwalk.walk(buf, "x")
    assert layout.sample_bounds(layout.samples()).tolist() == reference_tar.sample_spans(members, reference_tar.group(members, "x")[1])


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (
            tarwrite.member("a.txt", b"1") + tarwrite.TRAILER + tarwrite.member("b.txt", b"2") + tarwrite.TRAILER,
            "data follows the end-of-archive marker",
        ),
        (tarwrite.member("a.txt", b"1") + tarwrite.TRAILER + bytes(100) + b"z", "data follows the end-of-archive marker"),
        (tarwrite._header(b"a.txt", 0, b"0")[:124] + b"-0000001000" + bytes(512 - 135) + tarwrite.TRAILER, "size field .* unsigned octal"),
    ],
)
def test_concatenated_archives_and_signed_sizes_are_refused(buf, message):
    with pytest.raises(shardkit.CorruptShardError, match=message):
        tarindex.index(buf, "x")
    padded = archive([("a.txt", b"1")]) + bytes(9216)
    assert tarindex.index(padded, "x").all_names() == ["a.txt"]


long_names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_./"), min_size=1, max_size=130).filter(
    lambda n: not n.startswith("/") and ".." not in n.split("/")
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(names, long_names), st.binary(max_size=50)), max_size=12))
def test_sample_keys_are_the_walks_keys(members):
    buf = archive(members)
    try:
        keys, starts = reference_tar.group(tarwalk.walk(buf, "x"), "x")
    except shardkit.CorruptShardError:  # a repeated extension: samples() refuses it too
        with pytest.raises(shardkit.CorruptShardError):
            tarindex.index(buf, "x").samples()
        return
    layout = tarindex.index(buf, "x")
    assert layout.samples().tolist() == starts
    found = layout.sample_keys(np.asarray(starts[:-1], dtype=np.int64))
    assert [bytes(k).decode("utf-8", "surrogateescape") for k in found] == keys
