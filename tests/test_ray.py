"""executor="ray": the same bytes and manifest as the local executor, errors as local, a killed worker retried.

One two-node Ray cluster on this machine (a head and one more node, one CPU each) serves the module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import shardkit
from shardkit.cli import main

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'shardkit[ray]'): executor='ray' is not tested")
cluster_utils = pytest.importorskip("ray.cluster_utils")

ROOT = Path(__file__).resolve().parents[1]
UNITS = 24
PILES = 4


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node, one CPU each; Ray workers import this checkout and these tests."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), *([old] if old else [])])
    ray.shutdown()
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def three(unit):
    for k in range(3):
        yield {"__key__": f"u{unit:03d}-{k}", "txt": f"unit {unit} sample {k} " * (1 + unit % 5)}


def failing(unit):
    if unit == 7:
        raise ValueError(f"bad unit {unit}")
    yield from three(unit)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _run(out: Path, fn=three, **kwargs):
    return shardkit.preprocess(range(UNITS), fn, out, piles=PILES, seed=3, quiet=True, **kwargs)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_ray_writes_the_bytes_and_manifest_local_writes(tmp_path, cluster, on_error):
    fn = three if on_error == "raise" else failing
    one = _run(tmp_path / "one", fn, on_error=on_error)
    two = _run(tmp_path / "two", fn, on_error=on_error, workers=2, mp_context="spawn")
    on_ray = _run(tmp_path / "ray", fn, on_error=on_error, executor="ray", ray_address=cluster.address)
    assert on_ray == one == two
    assert _files(tmp_path / "ray") == _files(tmp_path / "one") == _files(tmp_path / "two")
    assert on_ray.samples == 3 * (UNITS if on_error == "raise" else UNITS - 1)
    assert [p.name for p in (tmp_path / "ray").iterdir() if p.name.startswith(".")] == []  # staging removed


def test_a_failing_unit_raises_the_local_error(tmp_path, cluster):
    with pytest.raises(shardkit.InputError) as local:
        _run(tmp_path / "local", failing)
    with pytest.raises(shardkit.InputError) as on_ray:
        _run(tmp_path / "ray", failing, executor="ray")
    assert str(on_ray.value) == str(local.value)
    assert "input unit 7 (7): fn raised ValueError: bad unit 7" in str(on_ray.value)
    assert not (tmp_path / "ray" / "shardkit.json").exists()


def test_a_killed_worker_is_retried_and_nothing_is_lost_or_doubled(tmp_path, cluster):
    marker = tmp_path / "killed"

    def dies_once(unit):
        for k, sample in enumerate(three(unit)):
            if unit == 13 and k == 2 and not marker.exists():
                marker.write_text("once")  # the retry runs the unit whole
                os.kill(os.getpid(), 9)
            yield sample

    expected = _run(tmp_path / "local", three)
    # a buffer of one byte: the first attempt's samples are on disk when it dies
    result = _run(tmp_path / "ray", dies_once, executor="ray", ray_address=cluster.address, buffer_size=1)
    assert marker.exists(), "the worker was never killed"
    assert result == expected
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


def test_the_pile_command_takes_executor_ray(tmp_path, cluster):
    src = tmp_path / "src"
    shardkit.preprocess(range(6), three, src, piles=3, quiet=True)
    for name, extra in (("local", []), ("ray", ["--executor", "ray", "--ray-address", cluster.address])):
        assert main(["pile", str(src / "pile-*.tar"), "-o", str(tmp_path / name), "--piles", "2", "--seed", "1", "-q", *extra]) == 0
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


def test_without_ray_executor_ray_asks_for_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    with pytest.raises(shardkit.ConfigError, match=r"pip install 'shardkit\[ray\]'"):
        _run(tmp_path / "out", executor="ray")
    assert not (tmp_path / "out" / "shardkit.json").exists()
