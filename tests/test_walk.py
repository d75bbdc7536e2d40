"""The vectorized tar walk agrees with the member-by-member walk on any input, damaged or not."""

from __future__ import annotations

import contextlib
import io
import re
import tarfile

import numpy as np
import pytest
import reference_tar
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.errors import CorruptShardError
from shardkit.tar import index as tarindex
from shardkit.tar import walk as tarwalk
from shardkit.tar import write as tarwrite
from shardkit.tar.scan import parse_pax, scan
from shardkit.tar.shard import Shard

names = st.one_of(
    st.from_regex(r"[a-z0-9_]{1,12}(/[a-z0-9]{1,6})?\.(bin|cls|txt|a\.b)", fullmatch=True),
    st.text(alphabet="abcé./_", min_size=1, max_size=130),
)
members = st.lists(st.tuples(names, st.binary(max_size=1200)), min_size=0, max_size=8)


def archive(items: list[tuple[str, bytes]], how: str) -> bytes:
    if how == "shardkit":
        return b"".join(tarwrite.member(n, d) for n, d in items) + tarwrite.TRAILER
    out = io.BytesIO()
    fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[how]
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for n, d in items:
            info = tarfile.TarInfo(n)
            info.size = len(d)
            with contextlib.suppress(ValueError):  # ustar cannot hold this name
                t.addfile(info, io.BytesIO(d))
    return out.getvalue()


def outcome(fn, buf: bytes):
    try:
        return fn(buf, "x.tar")
    except CorruptShardError as e:
        return str(e)


@settings(max_examples=150, deadline=None)
@given(
    items=members,
    how=st.sampled_from(["shardkit", "ustar", "gnu", "pax"]),
    damage=st.sampled_from(["none", "truncate", "flip", "set"]),
    where=st.floats(0, 1),
    value=st.integers(0, 255),
)
def test_fast_walk_agrees_with_the_careful_walk(items, how, damage, where, value):
    buf = bytearray(archive(items, how))
    at = int(where * max(len(buf) - 1, 0))
    if damage == "truncate":
        buf = buf[:at]
    elif damage in ("flip", "set") and buf:
        buf[at] = buf[at] ^ 0x55 if damage == "flip" else value
    data = bytes(buf)
    assert outcome(tarwalk.walk, data) == outcome(tarwalk._walk_members, data)


entries = st.lists(st.one_of(st.tuples(names, st.binary(max_size=1200)), st.from_regex(r"[a-z.]{1,8}/", fullmatch=True)), max_size=8)


@settings(max_examples=100, deadline=None)
@given(
    items=entries,
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    mtime=st.sampled_from([0, 1.5]),  # a float mtime puts a pax header in front of each entry
    damage=st.sampled_from(["none", "truncate", "flip"]),
    where=st.floats(0, 1),
)
def test_fast_walk_agrees_with_the_careful_walk_on_directory_entries(items, fmt, mtime, damage, where):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for item in items:
            info = tarfile.TarInfo(item if isinstance(item, str) else item[0])
            info.mtime = mtime
            if isinstance(item, str):
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(item[1])
            with contextlib.suppress(ValueError):
                t.addfile(info, None if isinstance(item, str) else io.BytesIO(item[1]))
    buf = bytearray(out.getvalue())
    at = int(where * max(len(buf) - 1, 0))
    if damage == "truncate":
        buf = buf[:at]
    elif damage == "flip" and buf:
        buf[at] ^= 0x55
    data = bytes(buf)
    walked = outcome(tarwalk.walk, data)
    assert walked == outcome(tarwalk._walk_members, data)
    # what tarfile (and so webdataset) reads; it strips a trailing '/' off any pax path, even a file's
    if damage == "none" and not isinstance(walked, str) and not any(name.endswith("/") for name in walked.names):
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            assert walked.names == [m.name for m in t.getmembers() if m.isfile()]


def test_fast_walk_takes_plain_archives():
    buf = b"".join(tarwrite.member(f"k{i}.bin", bytes(700)) for i in range(5)) + tarwrite.TRAILER
    fast = tarwalk._walk_plain(buf)
    assert fast is not None and fast == tarwalk._walk_members(buf, "x.tar")
    # a data block that looks like a header is never taken for one
    inner = tarwrite.member("fake.bin", b"zz")
    tricky = tarwrite.member("a.bin", inner + bytes(100)) + tarwrite.member("b.bin", b"1") + tarwrite.TRAILER
    assert tarwalk._walk_plain(tricky) == tarwalk._walk_members(tricky, "x.tar")
    assert tarwalk._walk_plain(tricky).names == ["a.bin", "b.bin"]


def samples_of(buf: bytes, plain: bool):
    """Every sample of ``buf`` read through Shard (fast or careful index), or the error text."""
    try:
        pile = Shard("x.tar", buf, chain=scan(buf) if plain else None)
        get = pile.sampler()
        out = [pile.sample(i) for i in range(len(pile))]
        assert [get(i) for i in range(len(pile))] == out
        return pile.keys, out
    except CorruptShardError as e:
        return str(e)


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.from_regex(r"[a-z0-9_]{1,6}(/[a-z.]{1,4})?", fullmatch=True), max_size=6),
    fields=st.lists(st.sampled_from(["bin", "cls", "a.b", "", "__key__", "txt"]), min_size=1, max_size=4),
    dropped=st.sets(st.integers(0, 23), max_size=3),
    payload=st.binary(max_size=40),
)
def test_fast_layout_agrees_with_the_careful_walk(keys, fields, dropped, payload):
    """Samples of one schema (the vectorized field pattern) or not (members dropped), any names."""
    items = []
    for k, key in enumerate(keys):
        for f, field in enumerate(fields):
            if k * len(fields) + f not in dropped:
                items.append((f"{key}.{field}" if field else key, payload + bytes([k, f])))
    buf = archive(items, "shardkit")
    fast, careful = samples_of(buf, True), samples_of(buf, False)
    if isinstance(careful, str) and "already has a" in careful:  # the careful walk refuses the pile, the fast one the sample
        assert isinstance(fast, str) and "already has a" in fast and "already has a" in careful
    else:
        assert fast == careful


def test_fast_walk_leaves_signed_sizes_and_concatenated_archives_to_the_careful_walk():
    from shardkit.tar.scan import scan

    good = tarwrite.member("a.txt", b"x" * 600) + tarwrite.member("b.txt", b"y") + tarwrite.TRAILER
    signed = good[:124] + b"-0000001000" + good[135:]
    joined = tarwrite.member("a.txt", b"1") + bytes(512) + tarwrite.member("b.txt", b"2") + tarwrite.TRAILER
    for buf in (signed, joined):
        assert scan(buf) is None and scan(buf, checksums=False) is None
    assert scan(good + bytes(8192)) is not None  # zero padding after the trailer is fine


def mtime_pax_archive(items: list[tuple[str, bytes]]) -> bytes:
    """What webdataset writes: Python's tarfile in pax format, a pax header (float mtime) per member."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for n, d in items:
            info = tarfile.TarInfo(n)
            info.size, info.mtime = len(d), 1700000000.25
            t.addfile(info, io.BytesIO(d))
    return out.getvalue()


rich_names = st.one_of(
    st.from_regex(r"[a-z0-9]{1,8}(/[a-zé.]{1,5})?(\.[a-z]{1,3}){0,2}", fullmatch=True),
    st.text(alphabet="aé./_\x7f", min_size=1, max_size=101),
)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(st.tuples(rich_names, st.binary(max_size=700)), max_size=8),
    how=st.sampled_from(["shardkit", "ustar", "gnu", "pax", "mtime-pax"]),
)
def test_fast_index_agrees_with_the_careful_walk_on_any_names(items, how):
    """Non-ASCII and 100-byte names, keys of different lengths, names without a dot, pax mtimes."""
    buf = mtime_pax_archive(items) if how == "mtime-pax" else archive(items, how)
    fast, careful = samples_of(buf, True), samples_of(buf, False)
    if isinstance(careful, str) and "already has a" in careful:  # the careful walk refuses the pile, the fast one the sample
        assert isinstance(fast, str) and "already has a" in fast
    else:
        assert fast == careful
    assert outcome(tarwalk.walk, buf) == outcome(tarwalk._walk_members, buf)


def test_the_fast_index_takes_non_ascii_names_and_webdataset_pax_headers():
    from shardkit.tar.scan import scan

    utf8 = archive([("é1.txt", b"a"), ("é1.cls", b"1"), ("k" * 96 + ".bin", b"b")], "ustar")  # a name filling the field
    pax = mtime_pax_archive([("a1.txt", b"a"), ("a1.cls", b"1"), ("a2.txt", b"b")])
    for buf in (utf8, pax):
        assert scan(buf) is not None
        assert samples_of(buf, True) == samples_of(buf, False)
    assert scan(utf8).names() == ["é1.txt", "é1.cls", "k" * 96 + ".bin"]
    assert scan(pax).gaps and scan(pax).names() == ["a1.txt", "a1.cls", "a2.txt"]


def reference_octal(field: bytes) -> int:
    """The first run of octal digits in ``field`` (what the walk reads a checksum as), -1 if none."""
    digits = re.search(rb"[0-7]+", field)
    return int(digits.group(), 8) if digits else -1


fields = st.one_of(
    st.integers(0, 8**6 - 1).map(lambda v: b"%06o\x00 " % v),  # how shardkit, GNU tar and tarfile write it
    st.integers(0, 8**7 - 1).map(lambda v: b"%07o\x00" % v),
    st.binary(min_size=8, max_size=8),
    st.from_regex(rb"[ 0-9\x00]{8}", fullmatch=True),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(fields, min_size=1, max_size=6))
def test_octal_fields_are_read_as_the_walk_reads_them(batch):
    from shardkit.tar.scan import octal

    values = octal(np.frombuffer(b"".join(batch), dtype=np.uint8).reshape(len(batch), 8))
    assert values.tolist() == [reference_octal(f) for f in batch]


keywords = st.one_of(st.sampled_from(["mtime", "path", "size", "pathx", "sizes", "uname", "linkpath", ""]), st.text(max_size=6))
pax_data = st.one_of(
    st.builds(lambda k, v: tarwrite._pax_record(k, v), keywords, st.text(max_size=30)),
    st.builds(lambda k, v: tarwrite._pax_record(k, v)[:-1] + b"=\n", keywords, st.text(max_size=30)),
    st.binary(max_size=70),
    st.from_regex(rb"[0-9]{1,2} (path|size|mtime)?[=\n]?[a-z0-9.=\n]{0,20}", fullmatch=True),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(pax_data, min_size=1, max_size=5))
@example([b"3 \n"])  # an empty record: the numpy check takes it, so the parser must too
def test_pax_data_taken_without_parsing_is_harmless(batch):
    """What the numpy check is sure of, the parser agrees with: one record, no path, no size."""
    from shardkit.tar.scan import _one_record, parse_pax

    blocks = np.zeros((len(batch), 512), dtype=np.uint8)
    for i, data in enumerate(batch):
        blocks[i, : len(data)] = np.frombuffer(data, dtype=np.uint8)
    sizes = np.array([len(d) for d in batch], dtype=np.int64)
    for data, sure in zip(batch, _one_record(blocks, np.arange(len(batch)), sizes).tolist(), strict=True):
        if sure:
            records = parse_pax(data)
            assert len(records) == 1 and "path" not in records and "size" not in records
    mtime = tarwrite._pax_record("mtime", "1795338852.4349883")  # what webdataset writes
    assert _one_record(np.frombuffer(mtime.ljust(512, b"\0"), dtype=np.uint8)[None], np.array([0]), np.array([len(mtime)])).all()


# -- regressions: inputs on which the fast and careful readers once disagreed ----------------


def _with_checksum(buf: bytearray, head: int) -> bytes:
    """``buf`` with the checksum of the header at ``head`` recomputed."""
    buf[head + 148 : head + 156] = b" " * 8
    buf[head + 148 : head + 156] = b"%06o\x00 " % sum(buf[head : head + 512])
    return bytes(buf)


def _pax_member(records: bytes, then: bytes) -> bytes:
    return tarwrite._header(b"././@PaxHeader", len(records), b"x") + records + bytes(-len(records) % 512) + then


def _float_mtime_tar() -> bytes:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("a.jpg")
        info.size, info.mtime = 600, 1.5  # a float mtime: tarfile writes a pax header first
        t.addfile(info, io.BytesIO(b"A" * 600))
    return bio.getvalue()


@pytest.mark.parametrize(("byte", "expected"), [(b"7", 0o11307), (b"x", "size field b'00000001130x' is not an unsigned octal number")])
def test_a_twelfth_size_digit_is_read_by_both_walks(byte, expected):
    """Size fields are 12 bytes: the fast scan used to read 11 and ignore the 12th."""
    buf = bytearray(_float_mtime_tar())
    buf[1024 + 135] = byte[0]
    buf = _with_checksum(buf, 1024)
    fast, careful = samples_of(buf, True), samples_of(buf, False)
    assert fast == careful
    if isinstance(expected, int):
        with tarfile.open(fileobj=io.BytesIO(buf)) as t:
            assert t.getmember("a.jpg").size == expected  # what Python's tarfile reads
        assert len(fast[1][0]["jpg"]) == expected
    else:
        assert expected in fast


def test_a_key_with_and_without_a_trailing_dot_repeats_the_empty_extension():
    buf = tarwrite.member("k", b"1") + tarwrite.member("k.", b"2") + tarwrite.TRAILER
    for read in (lambda: tarindex.index(buf, "x.tar").samples(), lambda: reference_tar.group(tarwalk.walk(buf, "x.tar"), "x.tar")):
        with pytest.raises(CorruptShardError, match=r"member 1 \('k\.'\) at offset 1024: sample 'k' already has a '' member"):
            read()


def test_a_huge_pax_size_is_a_corrupt_shard_not_a_value_error():
    body = b" size=" + b"1" * 5000 + b"\n"
    record = str(len(body) + 4).encode() + body
    buf = _pax_member(record, tarwrite.member("a.txt", b"x") + tarwrite.TRAILER)
    with pytest.raises(CorruptShardError, match=r"pax size record '1+' is not an unsigned decimal number below 10\*\*20"):
        Shard("x.tar", buf)


def test_long_names_and_a_repeated_extension_name_the_member():
    buf = (
        tarwrite.member("d/" + "x" * 120 + ".jpg", b"1")
        + tarwrite.member("a.jpg", b"1")
        + tarwrite.member("a.jpg", b"2")
        + tarwrite.TRAILER
    )
    with pytest.raises(CorruptShardError, match=r"member 2 \('a\.jpg'\) at offset 3072: sample 'a' already has a 'jpg' member"):
        tarindex.index(buf, "x.tar").samples()


def test_a_nul_in_a_pax_path_is_refused():
    buf = _pax_member(
        tarwrite._pax_record("path", "a\x00.jpg"), tarwrite.member("a.jpg", b"1") + tarwrite.member("a.txt", b"2") + tarwrite.TRAILER
    )
    for read in (lambda: tarindex.index(buf, "x.tar").samples(), lambda: Shard("x.tar", buf)):
        with pytest.raises(CorruptShardError, match=r"member 0 \('a\\x00\.jpg'\) at offset 1024: unsafe member name"):
            read()


@pytest.mark.parametrize("records", [b"2 2 2 2 2 2 ", b"0002 ", b"9 a=b\n", b"6 a=bc"])
def test_pax_records_must_hold_their_own_length_and_end_in_a_newline(records):
    with pytest.raises(ValueError, match="bad pax record length"):
        parse_pax(records)
    buf = _pax_member(records, tarwrite.member("a.txt", b"x") + tarwrite.TRAILER)
    with pytest.raises(CorruptShardError, match="at offset 0: malformed pax header"):
        Shard("x.tar", buf)
