"""Ctrl-C during a slow merge: the process exits at once, and the merge stops inside the pile it compresses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardkit.tar import compression, zstd_frames

ROOT = Path(__file__).resolve().parents[1]

# a child that piles 2 MiB of text into one zstd pile at level 19: one 2 MiB frame takes seconds
# (3-10 s on 2 cores) whole; the merge compresses it in pieces and checks for a stop before each
_CHILD = """
import sys, threading, time
import numpy as np
import zstandard
import shardkit

WORDS = np.array([b"pile ", b"shuffle ", b"sample ", b"epoch ", b"tar ", b"seed ", b"unit ", b"frame "])

def text(unit):
    for k in range(2):
        words = WORDS[np.random.default_rng((unit, k)).integers(0, len(WORDS), 140_000)]
        yield {"__key__": f"u{unit}-{k}", "txt": b"".join(words.tolist())[: 512 << 10]}

try:
    shardkit.preprocess(range(2), text, sys.argv[1], piles=1, compression="zstd", compression_level=19, quiet=True)
except KeyboardInterrupt:
    caught, stopped = time.time(), time.perf_counter()
    for thread in threading.enumerate():
        if thread.name.startswith("shardkit-merge"):
            thread.join()
    ended = time.perf_counter() - stopped
    # what a quarter of the frame takes here and now, whatever the load
    quarter = time.perf_counter()
    zstandard.ZstdCompressor(level=19).compress(next(text(0))["txt"])
    print(f"caught {caught:.3f} merge ended {ended:.3f} quarter {time.perf_counter() - quarter:.3f}", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_in_a_level_19_merge_stops_it_within_a_piece(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # SIGINT as a terminal gives it: a shell running the tests in the background would have the child ignore it
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    merging = out / ".shardkit-pass1" / "piles"
    deadline = time.monotonic() + 120
    while not merging.is_dir():
        assert child.poll() is None, child.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)  # into the pile's first frame
    sent = time.time()
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr.decode()[-2000:]
    said = re.search(r"caught (\S+) merge ended (\S+) quarter (\S+)", stdout.decode())
    assert said is not None, stdout.decode()
    caught, ended, quarter = map(float, said.groups())
    assert caught - sent < 1.0  # the job's own reaction; the interpreter's exit comes after
    # whole, the frame would go on for about 4 quarters; a piece of it is a sixteenth or less
    assert ended < quarter, f"the merge thread went on for {ended} s after Ctrl-C; a quarter of its frame takes {quarter} s"
    assert not (out / "shardkit.json").exists()
    assert not list(out.glob("pile-*"))


@pytest.mark.parametrize("codec", compression.CODECS)
def test_a_compressor_stops_at_the_next_piece(codec):
    data = b"".join(b"%08d pile shuffle sample epoch\n" % i for i in range(200_000))  # 6.6 MB
    calls = []

    def between():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    packer = compression.Compressor(codec, level=compression.DEFAULT_LEVEL[codec], between=between)
    with pytest.raises(KeyboardInterrupt):
        packer.compress(data)
    assert len(calls) == 3  # two pieces compressed, the third not begun


@pytest.mark.parametrize("codec", compression.CODECS)
def test_the_bytes_do_not_depend_on_how_the_stream_is_cut(codec):
    data = b"".join(b"%08d pile shuffle sample epoch\n" % (i * 7 % 1000) for i in range(120_000))
    whole = compression.compress(data, codec, level=compression.DEFAULT_LEVEL[codec])
    for cut in (1000, zstd_frames.PIECE - 1, 1 << 20):
        packer = compression.Compressor(codec, level=compression.DEFAULT_LEVEL[codec])
        cuts = b"".join(packer.compress(data[at : at + cut]) for at in range(0, len(data), cut)) + packer.finish()
        assert cuts == whole, cut
    assert compression.decompress(whole, codec, "x", size=len(data)) == data
