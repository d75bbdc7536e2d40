"""lz4 piles, damaged every way: each read gives the exact tar back or a CorruptShardError naming
the pile, never a codec's traceback or a short read taken for the whole; through
``compression.decompress``, the loader, ``verify`` and the ``lz4`` command-line tool."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shardkit
from shardkit import manifest
from shardkit.errors import CorruptShardError
from shardkit.tar import compression, lz4_blocks

URL = "d/pile-000001.tar.lz4"
DATA = b"".join(b"%08d alpha beta gamma\n" % i for i in range(600))
SIZE = len(DATA)
PACKED = compression.compress(DATA, "lz4", level=0)
HEADER = 7  # magic (4), flags, block descriptor, header checksum: no content size is written


def _read(buf, size=SIZE):
    """What decompressing ``buf`` gives: the bytes, or the CorruptShardError (checked to name the pile)."""
    try:
        return compression.decompress(buf, "lz4", URL, size=size)
    except CorruptShardError as e:
        assert str(e).startswith(f"{URL}: ") and e.__cause__ is None, repr(e)
        return e


def _flipped(buf, at, bit):
    return buf[:at] + bytes([buf[at] ^ (1 << bit)]) + buf[at + 1 :]


def test_the_frame_is_lz4s_own_and_independent_of_how_the_tar_arrives():
    assert PACKED[:4] == compression.MAGIC["lz4"]
    streamed = compression.Compressor("lz4", level=0)
    pieces = [streamed.compress(DATA[i : i + 777]) for i in range(0, len(DATA), 777)]
    assert b"".join(pieces) + streamed.finish() == PACKED  # the same bytes whatever the chunks: piles stay byte-identical
    assert _read(PACKED) == DATA


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(0, len(PACKED) - 1), st.integers(0, 7)), min_size=1, max_size=3, unique=True))
@example(flips=[(len(PACKED) - 14, 0)])  # the match length of the last sequence's token: read by no decoder
def test_bit_flips_anywhere_give_the_tar_or_a_corrupt_shard_error(flips):
    buf = PACKED
    for at, bit in flips:
        buf = _flipped(buf, at, bit)
    got = _read(buf)
    # never other bytes: the checksum or the decoder sees a flip in the data, block sizes or the content checksum; the
    # few bits no decoder reads (the match length in a block's last sequence, which has only literals) leave the tar whole
    assert got == DATA or isinstance(got, CorruptShardError), flips
    if all(at >= HEADER for at, _ in flips) and got == DATA:
        assert all(_read(_flipped(PACKED, at, bit)) == DATA for at, bit in flips), flips  # each flip alone changes nothing
    assert isinstance(_read(buf, size=None), bytes | CorruptShardError)


@settings(max_examples=300, deadline=None)
@given(end=st.integers(0, len(PACKED) - 1))
def test_a_truncated_pile_is_a_corrupt_shard_error_with_or_without_a_manifest(end):
    assert isinstance(_read(PACKED[:end]), CorruptShardError), end
    assert isinstance(_read(PACKED[:end], size=None), CorruptShardError), end  # lz4 hands back a short read: never taken as whole


def test_every_truncation_says_where():
    assert re.match(
        rf"{URL}: not valid lz4: corrupt or truncated \(the frame at byte 0 ends early, at byte 100\)", _read(PACKED[:100]).args[0]
    )
    assert re.match(rf"{URL}: not lz4 data: expected the magic bytes 04 22 4d 18, found an empty file", _read(b"").args[0])


def test_joined_frames_read_as_one_stream_and_the_manifest_size_is_checked():
    assert _read(PACKED + PACKED, size=2 * len(DATA)) == DATA + DATA
    assert "decompresses to over 15600 bytes, the manifest says 15600" in str(_read(PACKED + PACKED))
    assert isinstance(_read(PACKED + b"junk", size=None), CorruptShardError)  # trailing bytes that are no frame


@pytest.mark.parametrize("data", [b"", bytes(1024)], ids=["no-bytes", "empty-tar"])
def test_an_empty_tar_round_trips(data):
    assert compression.decompress(compression.compress(data, "lz4", level=0), "lz4", URL, size=len(data)) == data


# --- through the loader, verify and other tools --------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two lz4 piles of several 4 MiB blocks each (about 5 MB of tar apiece)."""
    rng = np.random.default_rng(7)
    out = tmp_path_factory.mktemp("lz4") / "ds"
    with shardkit.PileWriter(str(out), piles=2, seed=1, compression="lz4") as w:
        for i in range(40):
            w.write({"__key__": f"k{i:03d}", "bin": rng.integers(0, 16, 250_000, dtype=np.uint8).tobytes()})
    return str(out)


@pytest.mark.parametrize("flags", [{}, {"store_size": True}, {"block_checksum": True}, {"block_size": 4, "block_linked": True}])
@pytest.mark.parametrize("data", [b"", DATA, bytes(range(256)) * 40_000, np.random.default_rng(3).bytes(300_000)])
def test_a_checked_read_decodes_block_by_block_and_gives_the_same_bytes(flags, data):
    import lz4.frame

    frame = lz4.frame.compress(data, content_checksum=True, **({"store_size": False} | flags))
    descriptor_end = 7 + (8 if frame[4] & 0x08 else 0)
    assert lz4_blocks.header_check(frame[4 : descriptor_end - 1]) == frame[descriptor_end - 1]  # lz4's own check byte
    assert lz4_blocks.read_checked(frame, len(data)) == data
    assert compression.decompress(frame, "lz4", URL, size=len(data), checked=True) == data
    without = lz4.frame.compress(data, content_checksum=False, **({"store_size": False} | flags))
    assert lz4_blocks.read_checked(without, len(data)) == data  # no checksum to skip: read by blocks all the same


def test_the_bytes_decoded_into_are_unset_until_written_and_zeroed_where_the_c_api_is_missing(monkeypatch):
    made = lz4_blocks.unfilled_bytes(SIZE)
    assert made is not None and type(made[0]) is bytes and len(made[0]) == SIZE and made[1].flags.writeable
    made[1][:] = 7
    assert made[0] == bytes([7]) * SIZE  # the view writes into the bytes object itself
    view = lz4_blocks.unfilled_bytes(SIZE)[1]  # its bytes object is not held here: the view holds it
    view[:] = 3
    assert bytes(view) == bytes([3]) * SIZE
    assert lz4_blocks.read_checked(PACKED, 1 << 40) is None  # more than its blocks hold: nothing allocated, the full read names it
    first = lz4_blocks.read_checked(PACKED, SIZE)
    monkeypatch.setattr(lz4_blocks, "unfilled_bytes", lambda size: None)
    again = lz4_blocks.read_checked(PACKED, SIZE)
    assert first == again == DATA and type(again) is bytes


def test_without_liblz4s_decoder_at_hand_a_checked_read_takes_the_full_way(monkeypatch):
    monkeypatch.setattr(lz4_blocks, "decoder", lambda: None)
    assert lz4_blocks.read_checked(PACKED, SIZE) is None
    assert compression.decompress(PACKED, "lz4", URL, size=SIZE, checked=True) == DATA
    assert isinstance(_read(PACKED[:-5]), CorruptShardError)


def test_a_checked_read_of_frames_it_cannot_take_falls_back_to_the_full_read():
    joined = PACKED + PACKED  # two frames, as other tools may write: the fast path sees data after the first
    assert lz4_blocks.read_checked(joined, 2 * SIZE) is None
    assert compression.decompress(joined, "lz4", URL, size=2 * SIZE, checked=True) == DATA + DATA
    assert lz4_blocks.read_checked(PACKED, SIZE - 1) is None  # another size than the manifest's
    bad_header = _flipped(PACKED, HEADER - 1, 0)
    assert lz4_blocks.read_checked(bad_header, SIZE) is None
    assert isinstance(_read(bad_header), CorruptShardError)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(0, len(PACKED) - 1), st.integers(0, 7)), min_size=1, max_size=3, unique=True))
def test_a_checked_read_still_catches_every_flip_through_the_tars_checksum(flips):
    from shardkit.loading.pile import unpack

    expected = manifest.PileInfo(
        name="pile-000001.tar.lz4", samples=1, bytes=len(PACKED), checksum=manifest.format_checksum(manifest.checksum(PACKED)),
        compression="lz4", tar_bytes=SIZE, tar_checksum=manifest.format_checksum(manifest.checksum(DATA)),
    )  # fmt: skip
    buf = PACKED
    for at, bit in flips:
        buf = _flipped(buf, at, bit)
    try:
        got = unpack(URL, buf, expected, checksum=True)  # the stored bytes unchecked: only the tar's CRC-32 stands guard
    except CorruptShardError as e:
        assert str(e).startswith(f"{URL}: ") and e.__cause__ is None
    else:
        assert got == DATA


def _damage_pile(dataset, tmp_path, how):
    out = tmp_path / "bad"
    shutil.copytree(dataset, out)
    info = manifest.read(str(out)).piles[1]
    path = out / info.name
    data = path.read_bytes()
    data = {
        "flip": lambda: _flipped(data, len(data) // 2, 5),
        "checksum": lambda: _flipped(data, len(data) - 2, 0),
        "truncated": lambda: data[: len(data) // 2],
        "zstd": lambda: compression.compress(b"\0" * 1024, "zstd", level=1),
    }[how]()
    path.write_bytes(data)
    return str(out), info


MESSAGES = {
    "flip": r"not valid lz4: corrupt or truncated",
    "checksum": r"not valid lz4: corrupt or truncated \(ERROR_contentChecksum_invalid\)",
    "truncated": r"not valid lz4: corrupt or truncated \(the frame at byte 0 ends early",
    "zstd": r"not lz4 data: expected the magic bytes 04 22 4d 18, found 28 b5 2f fd",
}


def _epoch(source, **kwargs):
    return list(shardkit.loader(source, batch_size=8, seed=2, decode=False, drop_last=False, **kwargs))


@pytest.mark.parametrize("how", sorted(MESSAGES))
def test_a_damaged_lz4_pile_through_the_loader_and_verify(dataset, tmp_path, how):
    out, info = _damage_pile(dataset, tmp_path, how)
    with pytest.raises(CorruptShardError, match=rf"{info.name}: .*(checksum is crc32:|the manifest says)") as e:
        _epoch(out)
    assert e.value.__cause__ is None
    if how in ("flip", "checksum"):  # past the file's size check, the checksum skipped: decompression finds it
        with pytest.raises(CorruptShardError, match=rf"{info.name}: {MESSAGES[how]}") as e:
            _epoch(out, verify=False)
        assert e.value.__cause__ is None
    loader = shardkit.loader(out, batch_size=8, decode=False, on_error="skip", drop_last=False)
    assert sum(len(b["__key__"]) for b in loader) == 40 - info.samples and loader.stats.skipped_piles == 1
    problems = shardkit.verify(out, quiet=True)
    assert {p.name for p in problems} == {info.name}
    (compressed,) = [p for p in problems if p.kind == "compressed"]
    assert re.search(MESSAGES[how], compressed.message), compressed.message


def test_info_shows_lz4_and_the_ratio(dataset, capsys):
    from shardkit.cli.main import main

    assert main(["info", dataset]) == 0
    assert "lz4" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("lz4") is None, reason="the lz4 command-line tool is not installed (apt-get install lz4)")
def test_the_lz4_tool_and_tarfile_read_an_lz4_pile(dataset, tmp_path):
    info = manifest.read(dataset).piles[0]
    tar = tmp_path / "pile.tar"
    subprocess.run(["lz4", "-d", "-q", f"{dataset}/{info.name}", str(tar)], check=True)
    with tarfile.open(tar) as t:
        assert len({m.name.split(".", 1)[0] for m in t.getmembers()}) == info.samples
