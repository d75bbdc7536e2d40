"""The vectorized tar walk agrees with the member-by-member walk on any input, damaged or not."""

from __future__ import annotations

import contextlib
import io
import tarfile

from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit import _tar
from shardkit.errors import CorruptShardError
from shardkit.reader import PileData

names = st.one_of(
    st.from_regex(r"[a-z0-9_]{1,12}(/[a-z0-9]{1,6})?\.(bin|cls|txt|a\.b)", fullmatch=True),
    st.text(alphabet="abcé./_", min_size=1, max_size=130),
)
members = st.lists(st.tuples(names, st.binary(max_size=1200)), min_size=0, max_size=8)


def archive(items: list[tuple[str, bytes]], how: str) -> bytes:
    if how == "shardkit":
        return b"".join(_tar.member(n, d) for n, d in items) + _tar.TRAILER
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
    assert outcome(_tar.walk, data) == outcome(_tar._walk_members, data)


def test_fast_walk_takes_plain_archives():
    buf = b"".join(_tar.member(f"k{i}.bin", bytes(700)) for i in range(5)) + _tar.TRAILER
    fast = _tar._walk_plain(buf)
    assert fast is not None and fast == _tar._walk_members(buf, "x.tar")
    # a data block that looks like a header is never taken for one
    inner = _tar.member("fake.bin", b"zz")
    tricky = _tar.member("a.bin", inner + bytes(100)) + _tar.member("b.bin", b"1") + _tar.TRAILER
    assert _tar._walk_plain(tricky) == _tar._walk_members(tricky, "x.tar")
    assert _tar._walk_plain(tricky).names == ["a.bin", "b.bin"]


def samples_of(buf: bytes, plain: bool):
    """Every sample of ``buf`` read through PileData (fast or careful index), or the error text."""
    try:
        pile = PileData("x.tar", buf, plain=plain)
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
    if isinstance(careful, str):  # the careful walk refuses the pile, the fast one the sample
        assert isinstance(fast, str) and "already has a" in fast and "already has a" in careful
    else:
        assert fast == careful


def test_fast_walk_leaves_signed_sizes_and_concatenated_archives_to_the_careful_walk():
    from shardkit._fastwalk import plain_archive

    good = _tar.member("a.txt", b"x" * 600) + _tar.member("b.txt", b"y") + _tar.TRAILER
    signed = good[:124] + b"-0000001000" + good[135:]
    joined = _tar.member("a.txt", b"1") + bytes(512) + _tar.member("b.txt", b"2") + _tar.TRAILER
    for buf in (signed, joined):
        assert plain_archive(buf) is None and plain_archive(buf, checked=True) is None
    assert plain_archive(good + bytes(8192)) is not None  # zero padding after the trailer is fine
