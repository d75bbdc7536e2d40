"""Run one contender in a fresh process and measure its time, peak memory and what it reports.

Every measurement starts a new interpreter (or command), so imports, caches and allocator state
never leak from one contender into the next, and peak RSS belongs to that contender alone. Peak
RSS is the larger of two readings: the sum of RSS over the process tree, polled every 50 ms
with psutil when it is installed (worker processes included), and the kernel's high-water mark
of the main process (``VmHWM`` in ``/proc/PID/status``, read every 5 ms; a Python contender also
reports its own at the end), which no short spike escapes. ``wait4``'s ``ru_maxrss`` keeps the
high-water mark of the process that forked the child, here the harness itself: it is used only
for a command gone before the first look (``cat`` of a few MB), as an upper bound.

    result = measure_python("bench_read:raw_read", {"files": files})
    result["samples_per_s"], result["peak_rss"]
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
POLL_S = 0.005
# the process tree's RSS is summed every this many seconds: psutil finds children by reading
# every process in /proc, 1.7 ms a time here, which every 5 ms took a third of a core from
# the contender on 2 cores (the main process's VmHWM, 0.02 ms, is still read every POLL_S)
TREE_POLL_S = 0.05

try:
    import psutil
except ImportError:  # the kernel's peak of the main process is still measured
    psutil = None


class ContenderError(RuntimeError):
    """A contender's process failed; the message carries the end of its stderr."""


def child_env() -> dict[str, str]:
    """The environment of a contender: this checkout's shardkit first, no network for peers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, env.get("PYTHONPATH", "")) if p)
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    # one compute thread per process: the machine is small and the comparisons are per process
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return env


def _tree_rss(proc: Any) -> int:
    total = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0
    for p in members:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def _hwm(pid: int) -> int:
    """The kernel's RSS high-water mark of ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` to completion; returns wall seconds, peak RSS bytes, exit code and stderr."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=err, env=env)
        handle = psutil.Process(proc.pid) if psutil is not None else None
        polled = hwm = 0
        tree_due = start
        while True:
            hwm = max(hwm, _hwm(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if handle is not None and time.perf_counter() >= tree_due:
                polled = max(polled, _tree_rss(handle))
                tree_due = time.perf_counter() + TREE_POLL_S
            if time.perf_counter() - start > timeout:
                proc.kill()
                os.waitpid(proc.pid, 0)
                raise ContenderError(f"{argv[0]} ...: still running after {timeout:.0f} s; killed")
            time.sleep(POLL_S)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return {
        "wall_s": wall,
        # a process done before the first look leaves no VmHWM to read: then the kernel's maximum
        # at exit (ru_maxrss, KiB on Linux), an upper bound that counts the launcher's pages it
        # held before exec (about 50 MB here), so it is only the last resort
        "peak_rss": max(polled, hwm) or usage.ru_maxrss * 1024,
        # user + system time of the process and every descendant it reaped (its workers)
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_method": "max of the process tree's summed RSS (polled every 50 ms) and the main process's VmHWM (read every 5 ms; its maximum RSS at exit when it ended before the first look)"
        if handle is not None
        else "VmHWM of the main process (psutil absent: worker processes not counted)",
        "returncode": proc.returncode,
        "stderr": stderr,
    }


def _failure(what: str, run: dict[str, Any]) -> ContenderError:
    lines = [line for line in run["stderr"].strip().splitlines() if line.strip()]
    tail = " | ".join(lines[-3:]) if lines else "(no output)"
    return ContenderError(f"{what} exited with {run['returncode']}: {tail}")


def measure_python(target: str, params: dict[str, Any], *, python: str | None = None, timeout: float = 3600) -> dict[str, Any]:
    """Run ``module:function(params)`` from ``benchmarks/`` in a fresh interpreter.

    The function returns a dict of figures (see :mod:`_timing`); the process's wall time and
    peak RSS are added to it.

    Raises:
        ContenderError: the process failed or timed out.
    """
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump({"target": target, "params": params}, f)
        argv = [python or sys.executable, os.path.join(HERE, "child.py"), spec_path, out_path]
        run = run_measured(argv, timeout=timeout, env=child_env())
        if run["returncode"] != 0 or not os.path.exists(out_path):
            raise _failure(target, run)
        with open(out_path) as f:
            result: dict[str, Any] = json.load(f)
    peak = max(run["peak_rss"], result.pop("self_hwm", 0))
    # the contender's own count covers only its timed work; the process's covers imports too
    result.setdefault("cpu_s", run["cpu_s"])
    result.update(peak_rss=peak, wall_s=run["wall_s"], rss_method=run["rss_method"])
    return result


def call_fresh(target: str, params: dict[str, Any], *, timeout: float = 1800) -> dict[str, Any]:
    """``module:function(params)`` from ``benchmarks/`` in a fresh interpreter, its JSON result,
    without :func:`measure_python`'s watch on the process's memory (polling it every few ms takes
    CPU from a contender that needs every core).

    Raises:
        ContenderError: the process failed or timed out.
    """
    module, function = target.split(":")
    code = f"import json, sys; import {module} as m; print(json.dumps(m.{function}(json.loads(sys.argv[1]))))"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(params)], env=child_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise ContenderError(f"{target} ran past {timeout:.0f} s") from e
    if out.returncode != 0:
        raise ContenderError(f"{target}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure_command(argv: Sequence[str], *, timeout: float = 3600) -> dict[str, Any]:
    """Run an external command (``shuf``...) and return its wall time and peak RSS.

    Raises:
        ContenderError: the command failed or timed out.
    """
    run = run_measured(argv, timeout=timeout, env=child_env())
    if run["returncode"] != 0:
        raise _failure(argv[0], run)
    return {
        "seconds": run["wall_s"],
        "peak_rss": run["peak_rss"],
        "wall_s": run["wall_s"],
        "cpu_s": run["cpu_s"],
        "rss_method": run["rss_method"],
    }


def drop_page_cache() -> bool:
    """Flush dirty pages and drop the page cache (needs root); returns whether it worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True
