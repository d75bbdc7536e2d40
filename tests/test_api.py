"""The public surface: exactly what ``shardkit.__all__`` names, sorted, and all importable."""

from __future__ import annotations

import subprocess
import sys

import shardkit

PUBLIC = {
    "Blend", "BlendSource", "Codecs", "ConfigError", "CorruptShardError", "DatasetExistsError", "DatasetInfo", "DatasetNotFoundError",
    "DecodeError", "InputError", "Loader", "LoaderOptions", "Manifest", "ManifestError", "MapDataset", "PileInfo", "PileOptions",
    "PileTooLargeError", "PileWriter", "Problem", "QualityReport", "SampleError", "ShardkitError", "ShuffleOptions", "StorageError",
    "WorkerError",
    "__version__", "add_pile_args", "compare_shuffles", "export", "gc", "info", "load_job", "loader", "open", "pile", "pile_kwargs",
    "preprocess", "repile", "run_job", "shuffle", "verify",
}  # fmt: skip


def test_all_is_exactly_the_public_surface_and_sorted():
    assert set(shardkit.__all__) == PUBLIC
    assert list(shardkit.__all__) == sorted(shardkit.__all__)
    for name in shardkit.__all__:
        assert getattr(shardkit, name) is not None


def test_every_error_is_a_shardkit_error_and_the_builtin_a_caller_would_catch():
    assert issubclass(shardkit.DatasetNotFoundError, FileNotFoundError)
    assert issubclass(shardkit.DatasetExistsError, FileExistsError)
    for name in ("ConfigError", "SampleError", "ManifestError", "CorruptShardError", "PileTooLargeError", "DecodeError"):
        error = getattr(shardkit, name)
        assert issubclass(error, shardkit.ShardkitError) and issubclass(error, ValueError)
    assert issubclass(shardkit.InputError, RuntimeError)
    assert issubclass(shardkit.StorageError, shardkit.ShardkitError) and issubclass(shardkit.StorageError, OSError)


def test_importing_shardkit_stays_light():
    # torch, matplotlib and fsspec are optional extras: the core must not import them
    code = "import sys, shardkit; print(sorted(m for m in ('torch', 'matplotlib', 'fsspec') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_console_script_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "shardkit", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("pile", "shuffle", "run", "info", "verify", "quality", "repile", "demo"):
        assert command in out
