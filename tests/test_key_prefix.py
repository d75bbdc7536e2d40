"""Ordinary shards (keys restart at 000000 in every shard) pile, shuffle and run as YAML jobs by default."""

from __future__ import annotations

import functools
import gzip
import io
import tarfile
import textwrap
from pathlib import Path

import pytest

import shardkit
from shardkit import manifest
from shardkit.cli.jobs import load_job, run_job
from shardkit.cli.main import main
from shardkit.piles.key_prefix import first_key, resolve


def _shard(path, keys, *, pax=False, gz=False) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT if pax else tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            for ext in ("cls", "txt"):
                info = tarfile.TarInfo(f"{key}.{ext}")
                data = f"{key}-{ext}".encode()
                info.size, info.mtime = len(data), 1700000000.5 if pax else 0  # a float mtime: webdataset's pax headers
                tar.addfile(info, io.BytesIO(data))
    data = raw.getvalue()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


@pytest.fixture
def ordinary(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    return [_shard(src / f"train-{i:06d}.tar", [f"{k:06d}" for k in range(8)], pax=i % 2 == 1) for i in range(3)]


def _keys(out) -> list[str]:
    with shardkit.loader(str(out), decode=False, shuffle=False) as loader:
        return sorted(s["__key__"] for s in loader)


EXPECTED = sorted(f"train-{i:06d}/{k:06d}" for i in range(3) for k in range(8))


def test_first_key_reads_plain_pax_and_gzip_shards(tmp_path):
    assert first_key(_shard(tmp_path / "a.tar", ["dir/x.y"], pax=True)) == "dir/x"
    assert first_key(_shard(tmp_path / "b.tar.gz", ["000007"], gz=True)) == "000007"
    (tmp_path / "c.tar").write_bytes(b"")
    assert first_key(str(tmp_path / "c.tar")) is None
    assert resolve("auto", [str(tmp_path / "a.tar"), str(tmp_path / "b.tar.gz")]) == "none"
    assert resolve("none", [str(tmp_path / "b.tar.gz")] * 2) == "none"


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_first_key_reads_zstd_and_lz4_shards(tmp_path, codec):
    from shardkit.tar import compression

    plain = _shard(tmp_path / "a.tar", ["000007"])
    packed = tmp_path / f"a.tar{compression.SUFFIX[codec]}"
    packed.write_bytes(compression.compress(Path(plain).read_bytes(), codec, level=compression.DEFAULT_LEVEL[codec]))
    assert first_key(str(packed)) == "000007"
    assert resolve("auto", [str(packed), plain]) == "unit"  # both start at 000007


def test_cli_pile_takes_ordinary_shards_and_records_the_prefix(tmp_path, ordinary, capsys):
    out = tmp_path / "piles"
    assert main(["pile", str(tmp_path / "src" / "*.tar"), "-o", str(out), "--piles", "3", "-q"]) == 0
    assert manifest.read(str(out)).extra["key_prefix"] == "unit"
    assert _keys(out) == EXPECTED
    assert shardkit.verify(str(out), quiet=True) == []


def test_shards_with_unique_keys_keep_them(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    urls = [_shard(src / f"s{i}.tar", [f"s{i}-{k}" for k in range(4)]) for i in range(3)]
    m = shardkit.pile(urls, tmp_path / "out", piles=2, quiet=True)
    assert "key_prefix" not in m.extra
    assert _keys(tmp_path / "out") == sorted(f"s{i}-{k}" for i in range(3) for k in range(4))


def test_shuffle_and_yaml_jobs_take_ordinary_shards(tmp_path, ordinary):
    m = shardkit.shuffle(ordinary, tmp_path / "shuffled", piles=2, maxcount=10, quiet=True)
    assert m.extra["key_prefix"] == "unit" and m.samples == 24
    for kind, extra in (("pile", "  piles: 2\n"), ("shuffle", "  piles: 2\n  maxcount: 10\n")):
        (tmp_path / f"{kind}.yaml").write_text(f"job: {kind}\ninputs: src/*.tar\noutput:\n  path: {kind}-out\n" + extra)
        result = run_job(load_job(tmp_path / f"{kind}.yaml"), quiet=True)
        assert result.samples == 24
    # the option the error messages name is a YAML key too
    job = textwrap.dedent("""\
        job: pile
        inputs: src/*.tar
        key_prefix: none
        output: {path: refused, piles: 1}
    """)
    (tmp_path / "none.yaml").write_text(job)
    with pytest.raises(shardkit.SampleError, match="key_prefix='unit'"):
        run_job(load_job(tmp_path / "none.yaml"), quiet=True)


def test_an_append_keeps_the_datasets_prefix_for_a_single_new_shard(tmp_path, ordinary):
    # one shard a day appended to a dataset whose keys are prefixed: auto sees no two shards
    # that restart together, yet the new keys must be prefixed like the dataset's
    out = tmp_path / "grown"
    shardkit.pile(ordinary[:2], out, piles=2, quiet=True)
    for day, name in enumerate(("day-1", "day-2")):
        url = _shard(tmp_path / "src" / f"{name}.tar", [f"{k:06d}" for k in range(8)])
        assert main(["pile", url, "-o", str(out), "--piles", "2", "--append", "-q"]) == 0, day
    assert manifest.read(str(out)).extra["key_prefix"] == "unit"
    assert _keys(out) == sorted(EXPECTED[:16] + [f"{d}/{k:06d}" for d in ("day-1", "day-2") for k in range(8)])


@pytest.mark.parametrize("kind", ["pile", "shuffle"])
def test_shards_named_alike_in_two_folders_are_refused_with_the_way_out(tmp_path, ordinary, kind):
    # the prefix is already on: the error must say the two shards share a name, not ask for the prefix
    other = tmp_path / "other"
    other.mkdir()
    twin = _shard(other / "train-000000.tar", [f"{k:06d}" for k in range(8)])
    run = shardkit.pile if kind == "pile" else functools.partial(shardkit.shuffle, maxcount=10)
    with pytest.raises(shardkit.SampleError) as e:
        run([*ordinary, twin], tmp_path / "out", piles=2, quiet=True)
    said = str(e.value)
    assert "'train-000000/" in said and "file name" in said and "run again with key_prefix='unit'" not in said
