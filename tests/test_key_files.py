"""shardkit verify on the key-hash files beside a grown dataset's segments: each kind of damage, and the way out it prints."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import shardkit
from shardkit import manifest
from shardkit.cli.main import main
from shardkit.piles.leaves import hashes

OLD, NEW = [f"a{i}" for i in range(5)], [f"b{i}" for i in range(6)]
KEYS = "pile-000000.g000001.keys"  # beside the segment NEW went to (one pile: all of it)


def _write(out: str, keys: list[str], **options) -> None:
    with shardkit.PileWriter(out, piles=1, seed=0, **options) as w:
        for key in keys:
            w.write({"__key__": key, "bin": key.encode()})


def _grown(out: str, **options) -> bytes:
    """A dataset of OLD grown by NEW, verified sound; the bytes of NEW's keys file."""
    _write(out, OLD, **options)
    _write(out, NEW, mode="append", **options)
    assert shardkit.verify(out, quiet=True) == []
    with open(os.path.join(out, KEYS), "rb") as f:
        return f.read()


def _problems(out: str) -> list[tuple[str, str, bool]]:
    return [(p.name, p.kind, p.warning) for p in shardkit.verify(out, quiet=True)]


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_a_sound_grown_dataset_has_a_keys_file_beside_each_segment_and_no_problem(tmp_path, codec):
    out = str(tmp_path / "ds")
    held = _grown(out, compression=codec)
    assert np.array_equal(np.frombuffer(held, dtype="<u8"), np.sort(hashes(NEW)))
    assert sorted(n for n in os.listdir(out) if n.endswith(".keys")) == [KEYS, "pile-000000.keys"]
    _write(out, ["c0"], mode="append", compression=codec)
    assert shardkit.verify(out, quiet=True) == []


def test_a_changed_hash_of_the_right_size_and_order_is_named_and_deleting_the_file_puts_it_right(tmp_path):
    out = str(tmp_path / "ds")
    held = np.frombuffer(_grown(out), dtype="<u8").copy()
    lost = NEW[int(np.flatnonzero(hashes(NEW) == held[3])[0])]
    held[3] = held[2]  # still sorted, still 8 bytes a sample: an append trusts it
    held.tofile(os.path.join(out, KEYS))
    (problem,) = shardkit.verify(out, quiet=True)
    assert (problem.name, problem.kind, problem.warning) == (KEYS, "keys", False)
    assert problem.message.startswith("hash 3 is not the segment's: the keys file does not match pile-000000.g000001.tar")
    assert f"1 of the segment's keys have no hash in it ({lost!r} first), so an append would take them again" in problem.message
    # the way out it prints
    assert problem.message.endswith(
        "delete it: appends read the keys of pile-000000.g000001.tar instead (keys stay unique), and the next one writes it again"
    )
    os.unlink(os.path.join(out, KEYS))
    assert _problems(out) == [(KEYS, "missing-keys", True)]
    with pytest.raises(shardkit.SampleError, match=rf"key '{lost}' .* in pile-000000\.g000001\.tar"):
        _write(out, [lost], mode="append")
    _write(out, ["c0"], mode="append")
    assert shardkit.verify(out, quiet=True) == []
    assert np.array_equal(np.fromfile(os.path.join(out, KEYS), dtype="<u8"), np.sort(hashes(NEW)))


def test_a_truncated_keys_file(tmp_path):
    out = str(tmp_path / "ds")
    held = _grown(out)
    with open(os.path.join(out, KEYS), "wb") as f:
        f.write(held[:-8])
    (problem,) = shardkit.verify(out, quiet=True)
    assert (problem.name, problem.kind, problem.warning) == (KEYS, "keys", False)
    assert problem.message.startswith("40 bytes, its 6 samples need 48: it is not the key hashes of pile-000000.g000001.tar; delete it")


def test_a_missing_keys_file_is_a_warning_and_the_next_append_writes_it_again(tmp_path):
    out = str(tmp_path / "ds")
    held = _grown(out)
    os.unlink(os.path.join(out, "pile-000000.keys"))  # the first append puts in the one of the pile pass 1 wrote
    os.unlink(os.path.join(out, KEYS))
    problems = shardkit.verify(out, quiet=True)
    assert [(p.name, p.kind, p.warning) for p in problems] == [("pile-000000.keys", "missing-keys", True), (KEYS, "missing-keys", True)]
    assert str(problems[1]) == (
        f"{KEYS}: missing: appends read the keys of pile-000000.g000001.tar instead (keys stay unique), and the next one writes it again"
    )
    _write(out, ["c0"], mode="append")
    assert shardkit.verify(out, quiet=True) == []
    with open(os.path.join(out, KEYS), "rb") as f:
        assert f.read() == held


def test_an_unsorted_keys_file(tmp_path):
    out = str(tmp_path / "ds")
    held = np.frombuffer(_grown(out), dtype="<u8")
    held[::-1].tofile(os.path.join(out, KEYS))
    (problem,) = shardkit.verify(out, quiet=True)
    assert (problem.name, problem.kind) == (KEYS, "keys")
    assert problem.message.startswith("not sorted: hash 1 is smaller than hash 0 (5 such places): it is not the key hashes of")
    os.unlink(os.path.join(out, KEYS))
    _write(out, ["c0"], mode="append")
    assert shardkit.verify(out, quiet=True) == []


def test_cli_verify_fails_on_a_damaged_keys_file_and_warns_of_a_missing_one(tmp_path, capsys):
    out = str(tmp_path / "ds")
    held = _grown(out)
    with open(os.path.join(out, KEYS), "wb") as f:
        f.write(held[:8])
    assert main(["verify", "-q", out]) == 1
    printed, err = capsys.readouterr()
    assert printed.startswith(f"{out}: {KEYS}: 8 bytes, its 6 samples need 48: it is not the key hashes of pile-000000.g000001.tar")
    assert err.strip() == f"shardkit verify: error: 1 problem(s) found in {out}"
    os.unlink(os.path.join(out, KEYS))
    assert main(["verify", out]) == 0
    printed, _ = capsys.readouterr()
    assert re.search(rf"^{re.escape(out)}: warning: {KEYS}: missing: ", printed, re.MULTILINE)
    assert printed.rstrip().endswith(f"{out}: ok (1 warning(s))")


def test_verify_checks_the_keys_files_of_a_dataset_on_s3(s3):
    url = s3.url("ds")
    _write(url, OLD)
    _write(url, NEW, mode="append")
    segment = manifest.read(url).piles[0].segments[1].name  # on an object store it carries its job's token
    keys = manifest.keys_name(segment)
    held = np.frombuffer(s3.client().cat_file(s3.path(f"ds/{keys}")), dtype="<u8").copy()
    held[0] = 0  # sorted still: the smallest hash a key could have
    s3.client().pipe_file(s3.path(f"ds/{keys}"), held.tobytes())
    (problem,) = shardkit.verify(url, quiet=True)
    assert (problem.name, problem.kind) == (keys, "keys") and f"does not match {segment}" in problem.message
    s3.client().rm_file(s3.path(f"ds/{keys}"))
    assert _problems(url) == [(keys, "missing-keys", True)]
    _write(url, ["c0"], mode="append")
    assert shardkit.verify(url, quiet=True) == []
    assert s3.client().cat_file(s3.path(f"ds/{keys}")) == np.sort(hashes(NEW)).tobytes()
