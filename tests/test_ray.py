"""executor="ray": the same bytes and manifest as the local executor, errors as local, a killed worker retried.

One two-node Ray cluster on this machine (a head and one more node, one CPU each) serves the module.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import shardkit
from shardkit.cli import main
from shardkit.piles import ray_executor

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'shardkit[ray]'): executor='ray' is not tested")
cluster_utils = pytest.importorskip("ray.cluster_utils")

ROOT = Path(__file__).resolve().parents[1]
UNITS = 24
PILES = 4


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node, one CPU each; Ray workers import this checkout and these tests."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks"), *([old] if old else [])])
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


def test_the_pile_merge_runs_in_ray_workers_and_a_killed_one_is_retried(tmp_path, cluster):
    marker = tmp_path / "killed"

    def work(item):
        if item == 2 and not marker.exists():
            marker.write_text("once")
            os.kill(os.getpid(), 9)
        return item * 10, os.getpid()

    done = []
    results = ray_executor.ray_map(work, list(range(5)), done.append, address=cluster.address)
    assert marker.exists(), "the worker was never killed"
    assert [r[0] for r in results] == [0, 10, 20, 30, 40] and done == [1] * 5
    assert os.getpid() not in {pid for _, pid in results}


def test_a_killed_ray_driver_resumes_on_ray_or_locally_byte_identical(tmp_path, cluster):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kill_resume

    reference = str(tmp_path / "reference")
    kill_resume.run_job(reference, workers=1, executor="local", resume=False)
    for n, resumed_on in enumerate(["ray", "local"]):
        out = str(tmp_path / f"out{n}")
        proc = kill_resume.child(out, 1, "ray", resume=False, log=str(tmp_path / "a.log"), address=cluster.address)
        try:
            while kill_resume.committed(out) < 6:
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
        done = kill_resume.committed(out)
        address = cluster.address if resumed_on == "ray" else None
        redone = kill_resume.run_job(out, workers=1, executor=resumed_on, resume=True, log=str(tmp_path / "resumed.log"), address=address)
        # tasks the killed driver had handed to the cluster may still commit a unit before Ray
        # stops them: those are kept too, so the resume redoes at most what was missing here
        assert len(redone) <= kill_resume.UNITS - done
        assert kill_resume.files(out) == kill_resume.files(reference)


def test_shuffle_and_repile_run_pass_1_on_ray(tmp_path, cluster):
    src = tmp_path / "src"
    shardkit.preprocess(range(8), three, src, piles=3, quiet=True)
    for name, extra in (("local", {}), ("ray", {"executor": "ray", "ray_address": cluster.address})):
        shardkit.shuffle(str(src / "pile-*.tar"), tmp_path / f"shuffled-{name}", piles=2, maxcount=5, quiet=True, **extra)
        shardkit.repile(src, tmp_path / f"repiled-{name}", quiet=True, **extra)
    assert _files(tmp_path / "shuffled-ray") == _files(tmp_path / "shuffled-local")
    assert _files(tmp_path / "repiled-ray") == _files(tmp_path / "repiled-local")
    assert main(["repile", str(src), "-o", str(tmp_path / "cli"), "--executor", "ray", "--ray-address", cluster.address, "-q"]) == 0
    assert _files(tmp_path / "cli") == _files(tmp_path / "repiled-local")


def test_the_ray_benchmark_runs_and_checks_the_bytes():
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ray_pass1.py"), "--size", "smoke"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratio" in done.stdout and "ms a task" in done.stdout and "outputs byte-identical: yes" in done.stdout


def test_compressed_piles_merged_on_ray_equal_local(tmp_path, cluster):
    one = _run(tmp_path / "local", compression="zstd", max_pile_bytes=4096)
    on_ray = _run(tmp_path / "ray", compression="zstd", max_pile_bytes=4096, executor="ray", ray_address=cluster.address)
    assert on_ray == one and one.split_piles > 0
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    assert all(p.name.endswith(".tar.zst") for p in on_ray.piles)


@pytest.mark.parametrize("limit", [None, 4096], ids=["whole", "split"])
def test_an_append_on_ray_writes_the_segments_a_local_append_writes(tmp_path, cluster, limit):
    # split: pass 1 splits piles into sub-piles, the append rewrites them into leaves on the driver
    def later(unit):
        yield from ({**s, "__key__": "new-" + s["__key__"]} for s in three(unit))

    for name, kwargs in (("local", {}), ("ray", {"executor": "ray", "ray_address": cluster.address})):
        _run(tmp_path / name, compression="zstd", max_pile_bytes=limit)
        grown = _run(tmp_path / name, later, mode="append", compression="zstd", max_pile_bytes=limit, **kwargs)
        assert grown.generation == 1 and grown.samples == 6 * UNITS
    local, on_ray = shardkit.manifest.read(tmp_path / "local"), shardkit.manifest.read(tmp_path / "ray")
    assert on_ray.piles == local.piles
    assert any(s.resolution > 1 for p in local.piles for s in p.segments) == (limit is not None)
    assert {k: v for k, v in _files(tmp_path / "ray").items() if k.startswith("pile-")} == {
        k: v for k, v in _files(tmp_path / "local").items() if k.startswith("pile-")
    }


def test_a_lost_node_is_retried_and_nothing_is_lost_or_doubled(tmp_path, cluster):
    import threading

    log = tmp_path / "where.log"

    def slow(unit):
        with open(log, "a") as f:  # which node started the unit
            f.write(f"{ray.get_runtime_context().get_node_id()} {unit}\n")
        time.sleep(0.4)
        yield from three(unit)

    expected = _run(tmp_path / "local", three)
    node = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()

    def remove_once_busy():  # the node goes while a unit runs on it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and node.node_id not in (log.read_text() if log.exists() else ""):
            time.sleep(0.02)
        cluster.remove_node(node, allow_graceful=False)

    remover = threading.Thread(target=remove_once_busy)
    remover.start()
    try:
        result = _run(tmp_path / "ray", slow, executor="ray", ray_address=cluster.address)
    finally:
        remover.join()
    started = [line.split() for line in log.read_text().splitlines()]
    assert any(where == node.node_id for where, _ in started), "no unit ran on the node that was lost"
    assert len(started) > UNITS  # the lost node's units ran again elsewhere
    assert result == expected
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


class _Ray:
    """What connect() asks of Ray: whether a session is open, and how it starts one."""

    def __init__(self, open_: bool) -> None:
        self.open, self.calls = open_, []

    def is_initialized(self) -> bool:
        return self.open

    def init(self, **kwargs):
        self.calls.append(kwargs.get("address"))


@pytest.mark.parametrize(
    ("open_", "address", "env", "expected"),
    [
        (False, None, None, ["local"]),  # never a Ray another process (a killed run) left here
        (False, None, "10.0.0.1:6379", [None]),  # a job Ray runs: Ray reads RAY_ADDRESS itself
        (False, "auto", None, ["auto"]),
        (True, "auto", None, []),  # an open session is used as it is
    ],
)
def test_connect_starts_its_own_ray_unless_told_where(monkeypatch, open_, address, env, expected):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    ray = _Ray(open_)
    ray_executor.connect(ray, address)
    assert ray.calls == expected
