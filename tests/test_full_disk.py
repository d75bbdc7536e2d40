"""A job that fills the disk says in one line what its staging keeps and how to resume or discard it, and frees the rest.

The disk is a real 4 MiB tmpfs (when the tests run as root and may mount one), and a fault
injected at the production write call: every ``os.writev`` and ``os.write`` (what
:func:`shardkit.storage.write_chunks` writes part files and piles with) under the output fails
with ENOSPC once 1 MiB was written, in each process.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

import shardkit

SIZE = 4 << 20


def _units(unit: int):
    for k in range(20):
        yield {"__key__": f"u{unit:04d}-{k}", "bin": bytes([unit % 251]) * 1000}


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(request, tmp_path, monkeypatch):
    root = tmp_path / "disk"
    root.mkdir()
    mounted = False
    if request.param == "tmpfs":
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("a real full disk needs root to mount a tmpfs; the injected one runs instead")
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(root)], capture_output=True, text=True)
        if mount.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
        mounted = True
    else:  # the production write call fails as a full disk would
        real_writev, real_write, written = os.writev, os.write, [0]

        def spend(fd: int, size: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
                if written[0] + size > SIZE // 4:  # each process (the workers are forked) has a quarter
                    raise OSError(errno.ENOSPC, "No space left on device")
                written[0] += size

        def writev(fd, buffers):
            spend(fd, sum(map(len, buffers)))
            return real_writev(fd, buffers)

        def write(fd, data):
            spend(fd, len(data))
            return real_write(fd, data)

        monkeypatch.setattr(os, "writev", writev)
        monkeypatch.setattr(os, "write", write)
    yield root
    if mounted:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.mark.parametrize("units", [100, 150], ids=["full-while-publishing", "full-while-writing-parts"])
def test_an_append_that_fills_the_disk_frees_what_it_cannot_resume_and_says_how_to_go_on(small_disk, units):
    out = str(small_disk / "ds")
    shardkit.preprocess(range(4), _units, out, piles=2, quiet=True)
    with pytest.raises(shardkit.StorageError) as failed:
        shardkit.preprocess(range(10, 10 + units), _units, out, piles=2, mode="append", workers=2, quiet=True)
    said = str(failed.value)
    assert failed.value.errno == errno.ENOSPC and "\n" not in said and "no space left" in said
    staging = os.path.join(out, ".shardkit-pass1")
    if os.path.exists(staging):  # committed work is kept for resume=True, and nothing else
        assert "resume=True" in said and f"delete {staging} to start over" in said and "keeps" in said
        assert "piles" not in os.listdir(staging) and all(n.startswith(("part-", ".")) or n == "job.json" for n in os.listdir(staging))
        with pytest.raises(shardkit.DatasetExistsError, match=rf"or delete {staging} to discard it"):
            shardkit.preprocess(range(500, 502), _units, out, piles=2, mode="append", quiet=True)
        shutil.rmtree(staging)  # what the message says
    else:
        assert "is removed" in said
    assert shardkit.preprocess(range(500, 502), _units, out, piles=2, mode="append", quiet=True).generation == 1
    assert shardkit.verify(out, quiet=True) == []
