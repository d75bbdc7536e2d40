"""YAML batch jobs: validate a whole job file into option objects, then run it.

A job file holds exactly the options a Python user passes to :func:`shardkit.preprocess`,
:func:`shardkit.pile`, :func:`shardkit.shuffle` or the demo. Everything is checked before any
work starts (unknown keys, types, sizes, that inputs exist, that ``fn`` imports) and each
problem is reported as ``FILE: line N: FIELD.PATH: what was expected, what was found``::

    job: preprocess              # preprocess | pile | shuffle | demo
    inputs: raw/train            # a path, glob or brace pattern, or a list of them
    transform: images            # a built-in (images | jsonl | shards) ...
    # fn: mypackage.mymodule:make_samples   # ... or your own fn(unit, **args) yielding samples
    args: {size: 224}            # keyword arguments of the transform or fn
    output: {path: piles/train, piles: 256, seed: 0, max_pile_bytes: 2GiB, overwrite: false}
    workers: 8
    on_error: raise              # or skip

Relative paths (``inputs``, ``output.path``) are relative to the job file's directory, not to
the working directory, so a job runs the same from anywhere. An ``fn`` module is imported
normally; if Python cannot find it, it is also looked for in the job file's directory. The file
is read as plain data (:mod:`shardkit.cli.job_yaml`): tags that construct Python objects, and a
key written twice, are refused.

    job = load_job("configs/images.yaml")   # raises ConfigError naming file and field
    run_job(job)
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shardkit import storage
from shardkit._util import check_path, counted, shown
from shardkit.cli import schema
from shardkit.cli.job_yaml import key_lines, load_yaml, located
from shardkit.cli.schema import Fields
from shardkit.eager_shuffle import ShuffleOptions, shuffle
from shardkit.errors import ConfigError, DatasetNotFoundError
from shardkit.manifest import Manifest
from shardkit.option_fields import Spec, specs, yaml_names
from shardkit.piles import readers, transforms
from shardkit.piles.options import EXECUTORS, PileOptions
from shardkit.piles.preprocess import pile, preprocess, refuse_key_prefix

JOBS = ("preprocess", "pile", "shuffle", "demo")
T = TypeVar("T")


@dataclass(frozen=True)
class ImportedFn:
    """A user's ``module:function`` with its keyword arguments, imported where it is called.

    Picklable by name, so worker processes import the function themselves.

        fn = ImportedFn("mypkg.parse:records", {"lang": "en"}, search="configs")
        samples = fn("raw/part-0.jsonl")   # mypkg.parse.records("raw/part-0.jsonl", lang="en")
    """

    spec: str
    args: Mapping[str, Any] = field(default_factory=dict)
    search: str | None = None

    def resolve(self) -> Callable[..., Iterable[Mapping[str, Any]]]:
        return _import(self.spec, self.search)

    def __call__(self, unit: Any) -> Iterable[Mapping[str, Any]]:
        return self.resolve()(unit, **self.args)


@functools.lru_cache(maxsize=32)
def _import(spec: str, search: str | None) -> Callable[..., Any]:
    """Import ``module:function``; ConfigError (unprefixed) naming the module or the name."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name or not all(part.isidentifier() for part in (*module_name.split("."), *name.split("."))):
        raise ConfigError(f"expected 'module:function' (e.g. mypackage.prep:make_samples), got {spec!r}")
    try:
        module = _import_module(module_name, search)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r} for {spec!r}: {e}") from None
    except Exception as e:  # the module's own code failed: say so instead of a bare traceback
        raise ConfigError(f"importing module {module_name!r} for {spec!r} failed: {type(e).__name__}: {e}") from None
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no attribute {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{spec!r} is a {type(target).__name__}, not a function")
    return target


def _import_module(module_name: str, search: str | None) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")[0]
        if search is None or e.name != top or not any(os.path.exists(os.path.join(search, top + s)) for s in (".py", "")):
            raise
    # appended, not prepended: a module next to the job never shadows an installed one
    if search not in sys.path:
        sys.path.append(search)
    return importlib.import_module(module_name)


@dataclass(frozen=True, kw_only=True)
class PileJob:
    """``job: pile``: re-pile existing WebDataset shards.

    job = load_job("configs/repile.yaml")
    print(job.inputs, job.output, job.options.piles, job.options.workers)
    manifest = run_job(job)
    """

    source: str
    inputs: tuple[str, ...]
    output: str
    options: PileOptions
    # the inputs' reader (``format:`` and ``args:``), None for tar shards or to detect it
    format: Any = None

    @property
    def workers(self) -> int:
        return self.options.workers

    @property
    def on_error(self) -> str:
        return self.options.on_error


@dataclass(frozen=True, kw_only=True)
class PreprocessJob(PileJob):
    """``job: preprocess``: a pile job whose samples come from a transform or ``fn`` per unit."""

    fn: transforms.Images | transforms.JsonLines | transforms.Shards | ImportedFn | Any


@dataclass(frozen=True, kw_only=True)
class ShuffleJob:
    """``job: shuffle``: the eager shuffle of existing shards into fixed-size shards."""

    source: str
    inputs: tuple[str, ...]
    output: str
    options: ShuffleOptions


@dataclass(frozen=True, kw_only=True)
class DemoJob:
    """``job: demo``: the built-in demonstration; ``output`` None uses a temporary directory."""

    source: str
    output: str | None
    samples: int


Job = PreprocessJob | PileJob | ShuffleJob | DemoJob


def load_job(path: str | os.PathLike[str]) -> Job:
    """Read and validate a job file completely (inputs must exist, ``fn`` must import).

    Raises:
        ConfigError: anything wrong, as ``FILE: line N: FIELD: expected ..., got ...``.
        DatasetNotFoundError: the job file itself does not exist.
    """
    source = check_path("path", path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{source}: no such job file") from None
    except OSError as e:
        raise ConfigError(f"{source}: cannot read the job file ({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # the byte's line and column, as a YAML error gives them
        line, column = data.count(b"\n", 0, e.start) + 1, e.start - data.rfind(b"\n", 0, e.start)
        raise ConfigError(
            f"{source}: line {line}, column {column}: not UTF-8 text (byte {data[e.start]:#04x}); save the job file as UTF-8"
        ) from None
    doc = load_yaml(text, source)
    try:
        return parse_job(doc, source)
    except ConfigError as e:  # the field's line is added here, where the text is known
        raise ConfigError(located(str(e), source, key_lines(text))) from None


# the keys of a job besides its options; the options' keys come from the option classes' fields
_OWN = {
    "preprocess": ("job", "inputs", "transform", "fn", "args", "output"),
    "pile": ("job", "inputs", "output", "format", "args"),
    "shuffle": ("job", "inputs", "output"),
    "demo": ("job", "output", "samples"),
}
_OPTIONS: dict[str, type] = {"preprocess": PileOptions, "pile": PileOptions, "shuffle": ShuffleOptions}
_ALLOWED = {kind: (*own, *(yaml_names(_OPTIONS[kind], "job") if kind in _OPTIONS else ())) for kind, own in _OWN.items()}


def job_fields(kind: str) -> tuple[tuple[str, ...], type | None]:
    """The keys a job of ``kind`` holds besides its options, and its options class (None for ``demo``)."""
    return _OWN[kind], _OPTIONS.get(kind)


def parse_job(doc: Any, source: str) -> Job:
    """Validate a loaded YAML document into a job; ``source`` is the file it came from."""
    # job first, any other name let through: which fields are known depends on the kind it names
    top = Fields(doc, source=source, path="", allowed=list(doc) if isinstance(doc, dict) else ())
    kind = top.take("job", schema.choice(*JOBS), required=True)
    if kind in ("preprocess", "pile", "shuffle"):  # the jobs whose pass 1 takes an executor
        doc = _flat_executor(doc, source)
    top = Fields(doc, source=source, path="", allowed=_ALLOWED[kind])
    base = os.path.dirname(os.path.abspath(source))
    if kind == "demo":
        out = top.sub("output", ("path",), required=False).take("path", schema.path)
        from shardkit.tools.demo import MAX_DEMO, check_samples

        samples = top.take("samples", schema.count(MAX_DEMO, "the demo holds its whole dataset in memory"), default=50_000)
        with top.errors():
            check_samples(samples)
        with top.errors("output.path"):
            return DemoJob(source=source, output=_resolve(base, out) if out else None, samples=samples)
    inputs = []
    for i, named in enumerate(top.take("inputs", schema.strings, required=True)):
        with top.errors(f"inputs[{i}]"):
            inputs.append(_resolve(base, named))
    if kind == "shuffle":
        return _shuffle_job(top, tuple(inputs), base)
    return _piling_job(top, kind, tuple(inputs), base)


def _flat_executor(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """``executor: {kind: ray, address: auto}`` as the flat keys ``executor: ray``, ``ray_address: auto``."""
    if not isinstance(doc.get("executor"), dict):
        return doc
    nested = Fields(doc["executor"], source=source, path="executor", allowed=("kind", "address"))
    if doc.get("ray_address") is not None:
        raise ConfigError(f"{source}: ray_address: give the address once, as executor.address or as ray_address, not both")
    kind = nested.take("kind", schema.choice(*EXECUTORS), required=True)
    return {**doc, "executor": kind, "ray_address": nested.take("address", schema.string)}


def _shuffle_job(top: Fields, inputs: tuple[str, ...], base: str) -> ShuffleJob:
    output = top.sub("output", ("path", *yaml_names(ShuffleOptions, "output")))
    options = _options(ShuffleOptions, top, output)
    _check_inputs(top, inputs, folders=False)
    return ShuffleJob(source=top.source, inputs=inputs, output=_output_path(output, base), options=options)


def _piling_job(top: Fields, kind: str, inputs: tuple[str, ...], base: str) -> PileJob | PreprocessJob:
    output = top.sub("output", ("path", *yaml_names(PileOptions, "output")))
    options = _options(PileOptions, top, output)
    out = _output_path(output, base)
    if kind == "pile":
        reader = _parse_format(top, inputs)
        _check_inputs(top, inputs, folders=False)
        return PileJob(source=top.source, inputs=inputs, output=out, options=options, format=reader)
    fn = _parse_fn(top, base)
    with top.errors():  # here, where the file's line is known, not when the job runs
        refuse_key_prefix(options)
    _check_inputs(top, inputs, folders=isinstance(fn, transforms.Images))
    return PreprocessJob(source=top.source, inputs=inputs, fn=fn, output=out, options=options)


def _options(cls: type[T], top: Fields, output: Fields) -> T:
    """An options object from the job's fields: each where its field's metadata puts it (``yaml``).

    Each value is checked as its field's type and choices ask, then ``cls`` validates them all;
    an error is reported at the field it names (``output.piles`` or ``workers``).
    """
    places = {"output": output, "job": top}
    values = {}
    for spec in specs(cls).values():
        fields = places.get(spec.yaml or "")
        if fields is not None and (spec.required or fields.has(spec.name)):
            values[spec.name] = fields.take(spec.name, _check(spec), required=spec.required)
    try:
        return cls(**values)
    except ConfigError as e:
        named = specs(cls).get(str(e).partition(":")[0])
        with places["job" if named is not None and named.yaml == "job" else "output"].errors():
            raise


def _check(spec: Spec) -> Callable[[Any], Any]:
    """The YAML-level check of one option; the options class checks the rest."""
    if spec.choices is not None:
        return schema.choice(*spec.choices)
    if spec.is_bool:
        return schema.boolean
    return schema.anything


def _output_path(output: Fields, base: str) -> str:
    path = output.take("path", schema.path, required=True)
    with output.errors("path"):
        return _resolve(base, path)


def _parse_format(top: Fields, inputs: tuple[str, ...]) -> Any:
    """A pile job's ``format:`` (a reader name, or shards) and ``args:`` (the reader's arguments) as a reader or None."""
    name = top.take("format", schema.choice(*readers.READERS, *readers.SHARDS))
    args = top.take("args", schema.mapping, default={})
    if not args:
        return name
    if name is None:
        name = readers.detect(inputs[0])
    if name is None or name in readers.SHARDS:
        raise ConfigError(f"{top.source}: args: tar shards take no reader arguments (name the inputs' format with format:)")
    with top.errors("args"):
        return readers.make(name, **args)


def _parse_fn(top: Fields, base: str) -> transforms.Images | transforms.JsonLines | transforms.Shards | ImportedFn | Any:
    args = top.take("args", schema.mapping, default={})
    if top.has("fn") and top.has("transform"):
        raise ConfigError(f"{top.source}: fn: give either fn (your own function) or transform (a built-in), not both")
    if top.has("fn"):
        spec = top.take("fn", schema.string)
        with top.errors("fn"):
            _import(spec, base)
        return ImportedFn(spec, args, search=base)
    if not top.has("transform"):
        raise ConfigError(
            f"{top.source}: transform: missing: name a built-in ({', '.join(transforms.TRANSFORMS)}) or give fn: module:function"
        )
    name = top.take("transform", schema.string)
    if name in readers.READERS:  # a format's reader is a transform too
        with top.errors("args"):
            return readers.make(name, **args)
    with top.errors("transform"):
        transforms.get(name)  # an unknown name is named as the transform's fault, not the args'
    with top.errors("args"):
        return transforms.get(name, **args)


def _check_inputs(top: Fields, inputs: tuple[str, ...], *, folders: bool) -> None:
    """Every input names something that exists: a folder (image transforms) or files, no file twice."""
    named = storage.NamedOnce()
    for i, item in enumerate(inputs):
        with top.errors(f"inputs[{i}]"):
            if folders:
                if (why := transforms.not_a_folder(item)) is not None:
                    raise ConfigError(f"{item}: {why}: an image transform reads a folder of one subfolder per class")
            elif readers.detect(item) in ("hf", "mds", "litdata"):
                pass  # a folder its writer made: the reader says what is wrong with it
            else:
                try:
                    named.add(storage.expand(item), item)
                except DatasetNotFoundError as e:
                    raise ConfigError(str(e)) from None


# an environment variable in a job's path: $NAME or ${NAME} (a name starts with a letter or _); $$
# is a dollar sign; any other ${ is an error, not a folder name
_VARIABLE = re.compile(r"\$(?:\$|([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\}|(\{))")


def _resolve(base: str, path: str) -> str:
    """A job path with its environment variables filled in, made absolute against the job
    file's directory (URLs are left alone).

    Raises:
        ConfigError: a variable the environment does not set (the path would name a folder ``$NAME``).
    """

    how = "a path takes $NAME or ${NAME} from it; $$ is a dollar sign"

    def value(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        if found.group(3):
            raise ConfigError(f"{path}: a ${{ that is not ${{NAME}} ({how})")
        if name is None:
            return "$"
        if not os.environ.get(name):  # empty, $NAME/piles would be /piles
            said = "set but empty" if name in os.environ else "not set"
            raise ConfigError(f"{path}: ${name} is {said} in the environment ({how})")
        return os.environ[name]

    path = _VARIABLE.sub(value, path)
    local = storage.store_for(path).local_file()
    if local is None or path.startswith("file://"):
        return path
    return os.path.normpath(os.path.join(base, os.path.expanduser(local)))


def _units(job: PreprocessJob) -> tuple[list[Any], dict[str, Any] | None]:
    """The job's input units, and what the transform says about them for the manifest."""
    if isinstance(job.fn, ImportedFn):
        return storage.expand(list(job.inputs), once=True), None
    units, extra = transforms.prepare(job.fn, job.inputs, job.output, mode=job.options.mode)
    return units, extra or None


def run_job(job: Job, *, quiet: bool = False) -> Any:
    """Run a validated job; returns what the underlying function returns (a Manifest for all but the demo)."""
    if isinstance(job, PreprocessJob):
        units, extra = _units(job)
        return preprocess(units, job.fn, job.output, options=job.options, quiet=quiet, extra=extra)
    if isinstance(job, PileJob):
        return pile(list(job.inputs), job.output, options=job.options, quiet=quiet, format=job.format)
    if isinstance(job, ShuffleJob):
        return shuffle(list(job.inputs), job.output, options=job.options, quiet=quiet)
    if not isinstance(job, DemoJob):
        raise ConfigError(f"job: expected a job from load_job() or parse_job(), got {shown(job)}")
    from shardkit.tools.demo import demo

    return demo(out=job.output, samples=job.samples, quiet=quiet)


def describe(job: Job) -> str:
    """One line saying what a job will do (``shardkit run --check`` prints it)."""
    if isinstance(job, DemoJob):
        return f"demo job: {counted(job.samples, 'sample', grouped=True)} into {job.output or 'a temporary directory'}"
    what = {PreprocessJob: "preprocess", PileJob: "pile", ShuffleJob: "shuffle"}[type(job)]
    piles = counted(job.options.piles, "pile") if job.options.piles is not None else "auto piles"
    return f"{what} job: {len(job.inputs)} input pattern(s) -> {job.output} ({piles})"


def summary(result: Any) -> str:
    """What a finished job made: one line for a dataset, the demo's table for the demo."""
    if isinstance(result, Manifest):
        return f"{counted(result.samples, 'sample', grouped=True)} in {counted(len(result.piles), 'file')}" + (
            f", {counted(result.skipped_units, 'input unit')} skipped" if result.skipped_units else ""
        )
    from shardkit.tools.demo import DemoResult

    if isinstance(result, DemoResult):
        return result.table()
    return str(result)
