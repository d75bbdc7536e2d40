"""Entry point of a contender's process: run ``module:function(params)`` and write its figures.

Usage (the harness does this): ``python benchmarks/child.py SPEC.json RESULT.json`` where
SPEC holds ``{"target": "bench_read:raw_read", "params": {...}}``. The import of the module is
timed and reported as ``import_s``; the function's own figures follow. With ``_profile`` in the
params the call runs under cProfile and its stats go to ``<_profile>-<pid>.prof`` and ``.txt``.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from _timing import Clock, cpu_seconds, load_shardkit


def _profiled(fn: Callable[[dict[str, Any]], dict[str, Any]], params: dict[str, Any], stem: str) -> dict[str, Any]:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(fn, params)
    path = f"{stem}-{os.getpid()}"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    profiler.dump_stats(path + ".prof")
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    with open(path + ".txt", "w") as f:
        f.write(text.getvalue())
    return result


def _self_hwm() -> int:
    with open("/proc/self/status", "rb") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith(b"VmHWM:")), 0)


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    module_name, func_name = spec["target"].split(":")
    start = time.perf_counter()
    module = importlib.import_module(module_name)
    load_shardkit()
    import_s = time.perf_counter() - start
    params = spec["params"]
    fn = getattr(module, func_name)
    stem = params.pop("_profile", None)
    result = _profiled(fn, params, stem) if stem else fn(params)
    result["import_s"] = import_s
    if Clock.last is not None:  # workers are reaped by now, so their CPU time is counted
        result["cpu_s"] = cpu_seconds() - Clock.last.cpu_start
    result["self_hwm"] = _self_hwm()
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
