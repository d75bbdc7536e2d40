"""A waiting thread lends a hand: an lz4 frame's blocks decoded by the reader and the thread
waiting for its pile give the same bytes, whoever takes which block; a frame whose blocks do not
fill their places, a damaged block, or a helper that fails never give other bytes or a hang."""

from __future__ import annotations

import sys
import threading
import time

import lz4.frame
import numpy as np
import pytest

import shardkit
from shardkit import assist, manifest
from shardkit.assist import BOARD, Board
from shardkit.loading.prefetch import PileReader
from shardkit.tar import lz4_blocks

# blocks of 64 KiB (lz4's smallest), independent, as shardkit writes them but smaller
FRAME = {"block_size": lz4.frame.BLOCKSIZE_MAX64KB, "block_linked": False, "content_checksum": True}
DATA = b"".join(b"%07d lambda kappa mu nu\n" % i for i in range(20_000))  # ~560 KB: 9 blocks


class Recorder:
    """liblz4's block decoder, noting which thread decoded each block; the reader's first block
    waits until another thread has decoded one, so that the waiting thread surely takes a share."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.real, self.fail_on = lz4_blocks.decoder(), fail_on
        self.threads: list[str] = []
        self.helped = threading.Event()

    def __call__(self, *args):
        name = threading.current_thread().name
        if name == "reader" and not self.threads:
            self.threads.append(name)
            self.helped.wait(5)
        else:
            self.threads.append(name)
        if name == self.fail_on:
            raise RuntimeError("the helper failed")
        written = self.real(*args)
        if name != "reader":
            self.helped.set()
        return written


def _helped(fn):
    """``fn()`` in a thread named reader with a board set, this thread helping until it ends; its result or error."""
    board, out = Board(wake=lambda: None), []

    def run():
        token = BOARD.set(board)
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)
        finally:
            BOARD.reset(token)

    reader = threading.Thread(target=run, name="reader")
    reader.start()
    try:
        while reader.is_alive():
            if not board.help():
                reader.join(0.001)
    finally:
        reader.join(10)
    assert not reader.is_alive()
    return out[0]


def _read_with_help(frame: bytes, size: int):
    """``read_checked`` of ``frame`` with this thread helping (see :func:`_helped`); raises what it raised."""
    got = _helped(lambda: lz4_blocks.read_checked(frame, size))
    if isinstance(got, BaseException):
        raise got
    return got


@pytest.fixture
def recorder(monkeypatch):
    made = Recorder()
    monkeypatch.setattr(lz4_blocks, "decoder", lambda: made)
    return made


def test_the_waiting_thread_decodes_some_blocks_and_the_bytes_are_the_same(recorder):
    frame = lz4.frame.compress(DATA, **FRAME)
    assert _read_with_help(frame, len(DATA)) == DATA
    blocks = lz4_blocks.frame_blocks(memoryview(frame), len(DATA))[1]
    assert len(recorder.threads) == len(blocks) > 2 and {"reader", "MainThread"} <= set(recorder.threads)  # each block once


def test_stored_blocks_are_shared_too(recorder):
    data = np.random.default_rng(0).bytes(300_000)  # incompressible: every block stored as it is
    frame = lz4.frame.compress(data, **FRAME)
    recorder.helped.set()  # stored blocks are copied, not decoded: nothing waits for the decoder
    assert _read_with_help(frame, len(data)) == data


def test_blocks_that_do_not_fill_their_place_are_decoded_again_in_order(recorder):
    packer = lz4.frame.LZ4FrameCompressor(auto_flush=True, **FRAME)
    # a short block first (a flush), then one that fills the rest: two blocks for two places, the first one short
    frame = packer.begin() + packer.compress(DATA[:10_000]) + packer.compress(DATA[10_000:70_000]) + packer.flush()
    recorder.helped.set()
    assert _read_with_help(frame, 70_000) == DATA[:70_000]


def test_a_damaged_block_is_never_taken_for_the_tar(recorder):
    frame = bytearray(lz4.frame.compress(DATA, **FRAME))
    frame[len(frame) // 2] ^= 0xFF
    recorder.helped.set()
    got = _read_with_help(bytes(frame), len(DATA))
    assert got is None or got != DATA  # None: the full read names the fault; else the tar's CRC-32 catches it


def test_a_helper_that_fails_leaves_the_reader_to_finish(monkeypatch):
    failing = Recorder(fail_on="MainThread")
    monkeypatch.setattr(lz4_blocks, "decoder", lambda: failing)
    frame = lz4.frame.compress(DATA, **FRAME)
    with pytest.raises(RuntimeError, match="the helper failed"):
        _read_with_help(frame, len(DATA))  # the reader thread ended: no hang
    failing.helped.set()


def test_a_board_offers_until_withdrawn_and_a_spent_step_is_not_run_again():
    woken, steps = [], iter([True, False])
    board = Board(wake=lambda: woken.append(1))
    assert not board.offered() and board.help() is False
    board.offer(lambda: next(steps))
    assert woken == [1] and board.offered()
    assert board.help() is True
    assert board.help() is False and not board.offered()  # all of it taken: withdrawn
    board.offer(lambda: True)
    board.withdraw()
    assert board.help() is False
    assert assist.BOARD.get() is None  # nothing set outside a reader


def test_the_consumer_of_a_pile_reader_helps_the_read_it_waits_for():
    done = threading.Event()
    helpers: list[str] = []

    def step() -> bool:
        if done.is_set():
            return False
        helpers.append(threading.current_thread().name)
        done.set()
        return True

    def read(i: int) -> int:
        board = BOARD.get()
        assert board is not None
        board.offer(step)
        assert done.wait(5)  # only the consumer, waiting in get(), can take the step
        board.withdraw()
        return i

    reader = PileReader(range(2), read, slots=1, name="test-helped")
    try:
        assert reader.get() == 0
    finally:
        reader.close()
    assert helpers == [threading.current_thread().name]


def test_lz4_piles_of_several_blocks_read_the_same_as_plain(tmp_path):
    rng = np.random.default_rng(5)
    samples = [{"__key__": f"k{i:03d}", "txt": b"word %d " % i * rng.integers(1000, 20_000)} for i in range(300)]
    for compression in (None, "lz4"):
        with shardkit.PileWriter(str(tmp_path / str(compression)), piles=2, seed=3, compression=compression) as w:
            for s in samples:
                w.write(s)
    read = []
    for c in (None, "lz4"):
        loader = shardkit.loader(str(tmp_path / str(c)), seed=4, decode=False)
        read.append([(s["__key__"], s["txt"]) for _ in range(2) for s in loader])  # two epochs: the second reads kept memory
    assert read[0] == read[1] and len(read[0]) == 600
    assert min(p.tar_bytes for p in manifest.read(str(tmp_path / "lz4")).piles) > 8 << 20  # three blocks or more a pile


def test_the_tars_crc_is_taken_block_by_block_and_catches_a_changed_byte():
    from shardkit.dataset.file_checks import unpack
    from shardkit.errors import CorruptShardError
    from shardkit.tar import compression

    frame = lz4.frame.compress(DATA, **FRAME)
    tar, crc = _helped(lambda: compression.decompress_with_crc(frame, "lz4", "d/p.tar.lz4", size=len(DATA)))
    assert tar == DATA and crc == manifest.checksum(DATA)
    assert compression.decompress_with_crc(frame, "lz4", "d/p.tar.lz4", size=len(DATA))[1] == crc  # no board: taken after
    entry = manifest.PileInfo(
        name="p.tar.lz4", samples=1, bytes=len(frame), checksum="crc32:00000000",
        compression="lz4", tar_bytes=len(DATA), tar_checksum=manifest.format_checksum(crc),
    )  # fmt: skip
    blocks = lz4_blocks.frame_blocks(memoryview(frame), len(DATA))[1]
    caught = 0
    for at, _, _ in blocks:  # the first literal byte of each block changed: still valid lz4, another tar
        literals, first = frame[at] >> 4, at + 1  # the block's first token: its literals' length in the high half
        if literals == 15:  # the length goes on in bytes of 255, ended by one under 255
            while frame[first] == 255:
                first += 1
            first += 1
        assert literals > 0
        changed = bytearray(frame)
        changed[first] ^= 0x01
        got = _helped(lambda c=bytes(changed): unpack("d/p.tar.lz4", c, entry, checksum=True))
        if isinstance(got, CorruptShardError):
            caught += 1
            assert str(got).startswith("d/p.tar.lz4: the tar inside has checksum crc32:"), got  # the joined CRC-32 saw it
        else:
            assert got == DATA  # never other bytes
    assert caught == len(blocks)


@pytest.mark.parametrize("where", ["after the claim", "in the decoder"])
def test_a_ctrl_c_in_the_helping_consumer_leaves_nothing_stuck(monkeypatch, where):
    real, slow = lz4_blocks.decoder(), threading.Event()

    def decode(*args):
        if threading.current_thread().name == "rd" and not slow.is_set():
            slow.set()
            time.sleep(0.2)  # the reader is busy with its first block: the consumer takes the next
        return real(*args)

    monkeypatch.setattr(lz4_blocks, "decoder", lambda: decode)
    frame = lz4.frame.compress(DATA, **FRAME)
    fired = []

    def interrupt(frame_, event, arg):  # a Ctrl-C at the one moment named, in the consumer only
        if fired or threading.current_thread() is not threading.main_thread():
            return
        in_step = frame_.f_code is lz4_blocks.Blocks.step.__code__
        if where == "after the claim" and in_step and event == "c_return" and getattr(arg, "__name__", "") == "__exit__":
            fired.append(1)
            raise KeyboardInterrupt(where)
        if where == "in the decoder" and frame_.f_code is decode.__code__ and event == "return":
            fired.append(1)
            raise KeyboardInterrupt(where)

    reader = PileReader([0], lambda i: lz4_blocks.read_checked(frame, len(DATA)), slots=1, name="rd")
    sys.setprofile(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt, match=where):
            reader.get()
    finally:
        sys.setprofile(None)
    closing = threading.Thread(target=reader.close, daemon=True)
    closing.start()
    closing.join(10)
    assert fired and not closing.is_alive()  # the reader finished the frame alone and ended


def test_get_returns_none_once_another_thread_closes_the_reader():
    started = threading.Event()

    def read(i: int) -> int:
        started.set()
        time.sleep(0.3)
        return i

    reader = PileReader(range(3), read, slots=1)
    assert started.wait(5)
    threading.Timer(0.05, reader.close).start()
    assert reader.get() is None
