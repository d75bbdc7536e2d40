"""shardkit.open over a dataset with an unreadable data file: the others are served, its samples raise."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.dataset import index_file, layout
from shardkit.loading import early
from shardkit.loading import index as index_module
from tests.conftest import make_samples

N = 120
BAD = 2  # the pile damaged


def _write(out: str, n: int = N, **options) -> str:
    with shardkit.PileWriter(out, piles=4, seed=3, **options) as w:
        for s in make_samples(n):
            w.write(s)
    return out


def _flip(path: str, at: int = 600) -> None:
    data = bytearray(Path(path).read_bytes())
    data[at] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def _damage(path: str, how: str) -> type[Exception]:
    """Damage the file at ``path``; the error class reading it raises."""
    if how == "flipped":
        _flip(path)
    elif how == "truncated":
        Path(path).write_bytes(Path(path).read_bytes()[:1000])
    else:
        os.remove(path)
        return shardkit.DatasetNotFoundError
    return shardkit.CorruptShardError


def _samples(ds) -> list[dict]:
    return [ds[i] for i in range(len(ds))]


def _span(out: str, name: str) -> range:
    """The pile-order positions of the samples of data file ``name``."""
    start = 0
    for f in index_file.data_files(manifest.read(out)):
        if f.name == name:
            return range(start, start + f.info.samples)
        start += f.info.samples
    raise AssertionError(name)


def _check_served(ds, clean: list[dict], bad: range, error: type[Exception], name: str) -> None:
    """Every position outside ``bad`` reads the clean copy's sample; each inside raises naming ``name``."""
    assert len(ds) == len(clean)
    for i, want in enumerate(clean):
        if i in bad:
            with pytest.raises(error, match=rf"{re.escape(name)}.*sample {i - bad.start} of its {len(bad)} cannot be read"):
                ds[i]
        else:
            got = ds[i]
            assert got["__key__"] == want["__key__"] and bytes(got["bin"]) == bytes(want["bin"])


@pytest.mark.parametrize("how", ["flipped", "truncated", "missing"])
def test_a_bad_pile_raises_for_its_samples_and_the_others_are_served(tmp_path, monkeypatch, caplog, how):
    clean_dir = _write(str(tmp_path / "clean"))
    clean = _samples(shardkit.open(clean_dir, decode=False))
    out = str(tmp_path / "ds")
    shutil.copytree(clean_dir, out)
    os.remove(os.path.join(out, layout.index_name(0)))  # the clean open stored one: this copy has none, as written
    name = manifest.read(out).piles[BAD].name
    error = _damage(os.path.join(out, name), how)
    bad = _span(out, name)
    builds = []
    real = index_module.build
    monkeypatch.setattr(index_module, "build", lambda *a, **k: builds.append(1) or real(*a, **k))

    ds = shardkit.open(out, decode=False)
    with caplog.at_level(logging.WARNING):
        _check_served(ds, clean, bad, error, name)
        _check_served(ds, clean, bad, error, name)  # again: the same error, from what was remembered
    assert builds == [1]  # built once: not every pile read again for each sample
    assert caplog.text.count(name) == 1 and "1 of 4 data files could not be read" in caplog.text
    assert ds.index.failed.keys() == {BAD}
    kept = ds.index.failed[BAD]  # remembered without the frames that read the file, which hold its bytes
    assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None

    # never stored: a stored index is trusted later, and the loader's early start would read it
    idx_path = os.path.join(out, layout.index_name(0))
    assert not os.path.exists(idx_path)
    with pytest.raises(ValueError, match="unreadable"):
        index_module.encode(ds.index, ds.manifest)
    m = manifest.read(out)
    assert [early.lookup(out, 0, p, os.path.join(out, p.name)) for p in m.piles] == [None] * len(m.piles)

    # after the file is restored, a fresh open builds, stores and serves everything
    shutil.copy(os.path.join(clean_dir, name), os.path.join(out, name))
    fresh = shardkit.open(out, decode=False)
    assert [(s["__key__"], bytes(s["bin"])) for s in _samples(fresh)] == [(s["__key__"], bytes(s["bin"])) for s in clean]
    assert os.path.exists(idx_path) and not fresh.index.failed
    assert Path(idx_path).read_bytes() == Path(os.path.join(clean_dir, layout.index_name(0))).read_bytes()


def test_get_serves_keys_of_readable_piles_and_never_calls_a_key_missing_that_may_be_in_the_bad_one(tmp_path):
    out = _write(str(tmp_path / "ds"))
    clean = _samples(shardkit.open(out, decode=False))
    os.remove(os.path.join(out, layout.index_name(0)))
    name = manifest.read(out).piles[BAD].name
    _flip(os.path.join(out, name))
    bad = _span(out, name)
    good_key, bad_key = clean[bad.stop]["__key__"], clean[bad.start]["__key__"]

    ds = shardkit.open(out, decode=False)
    assert ds.get(good_key)["__key__"] == good_key and bytes(ds.get(good_key, None)["bin"]) == bytes(clean[bad.stop]["bin"])
    assert good_key in ds
    for key in (bad_key, "nope"):  # in the bad pile, or in no pile: from what was read, no one can tell which
        for call in (lambda k: ds.get(k), lambda k: ds.get(k, None), lambda k: k in ds):
            with pytest.raises(
                shardkit.CorruptShardError, match=rf"{name}: checksum .* key '{key}' is in none of the files read, and may be in this one"
            ):
                call(key)

    _flip(os.path.join(out, name))  # flipped back: the bytes are the written ones again
    fresh = shardkit.open(out, decode=False)
    assert fresh.get(bad_key)["__key__"] == bad_key and fresh.get("nope", None) is None
    with pytest.raises(KeyError, match="'nope': no sample has this key"):
        fresh.get("nope")


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_a_corrupt_compressed_pile_raises_for_its_samples_only(tmp_path, codec):
    out = _write(str(tmp_path / "ds"), compression=codec)
    clean = _samples(shardkit.open(out, decode=False))
    os.remove(os.path.join(out, layout.index_name(0)))
    name = manifest.read(out).piles[BAD].name
    assert name.endswith(".tar.zst" if codec == "zstd" else ".tar.gz")
    _flip(os.path.join(out, name), at=200)
    ds = shardkit.open(out, decode=False, keep_piles=1)
    _check_served(ds, clean, _span(out, name), shardkit.CorruptShardError, name)
    assert not os.path.exists(os.path.join(out, layout.index_name(0)))


def test_a_bad_segment_of_a_grown_pile_fails_alone(tmp_path):
    out = _write(str(tmp_path / "ds"), 60)
    with shardkit.PileWriter(out, piles=4, seed=3, mode="append") as w:
        for i in range(60):
            w.write({"__key__": f"new{i:03d}", "bin": bytes([i]) * 40, "cls": 1})
    m = manifest.read(out)
    clean = _samples(shardkit.open(out, decode=False))
    os.remove(os.path.join(out, layout.index_name(m.generation)))
    pile = next(p for p in m.piles if p.segments and len(p.segments) > 1 and all(s.samples for s in p.segments))
    segment = pile.segments[-1].name
    _flip(os.path.join(out, segment), at=100)
    bad = _span(out, segment)
    others = [_span(out, s.name) for s in pile.segments[:-1]]

    ds = shardkit.open(out, decode=False)
    _check_served(ds, clean, bad, shardkit.CorruptShardError, segment)
    assert all(ds[i]["__key__"] == clean[i]["__key__"] for r in others for i in r)  # the pile's other segments
    assert not os.path.exists(os.path.join(out, layout.index_name(m.generation)))
