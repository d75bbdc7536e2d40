"""YAML jobs: every mistake is named by file and field before any work starts; valid jobs run."""

from __future__ import annotations

import os
import re
import textwrap

import pytest
import yaml

import shardkit
from shardkit.cli import main
from shardkit.cli.jobs import ImportedFn, PileJob, PreprocessJob, ShuffleJob, load_job, run_job
from shardkit.piles import publish
from shardkit.piles.transforms import Images, JsonLines
from shardkit.tar.shard import iter_shard

IMAGES = """
job: preprocess
inputs: images
transform: images
output: {path: out, piles: 4}
"""
VALID = """
job: preprocess
inputs: data/*.jsonl
transform: jsonl
output: {path: out, piles: 4}
"""


@pytest.fixture
def job_dir(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "broken.py").write_text("x = 1 +\n")
    (tmp_path / "myprep.py").write_text("def make(unit, scale=1):\n    yield {'__key__': 'k', 'txt': str(scale)}\n\nvalue = 3\n")
    return tmp_path


def _write(job_dir, text: str) -> str:
    path = job_dir / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _error(job_dir, text: str) -> str:
    path = _write(job_dir, text)
    with pytest.raises(shardkit.ConfigError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return re.sub(r"^line \d+: (?=[\w.\[\]]+: )", "", message.removeprefix(f"{path}: "))  # a field's line: test_each_mistake_names_its_line


def test_valid_job_becomes_option_objects_with_paths_relative_to_the_file(job_dir, monkeypatch):
    monkeypatch.chdir("/")
    job = load_job(_write(job_dir, VALID + "workers: 2\n"))
    assert isinstance(job, PreprocessJob) and isinstance(job.fn, JsonLines)
    assert job.inputs == (str(job_dir / "data" / "*.jsonl"),) and job.output == str(job_dir / "out")
    assert job.options == shardkit.PileOptions(piles=4, workers=2) and (job.workers, job.on_error) == (2, "raise")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (VALID.replace("piles: 4", "piles: sixty"), "output.piles: expected an integer >= 1, got 'sixty'"),
        (VALID.replace("piles: 4", "piles: 0"), "output.piles: expected an integer >= 1, got 0"),
        (
            VALID.replace("piles: 4", "pilez: 4"),
            "output.pilez: unknown field (expected one of: path, piles, seed, max_pile_bytes, buffer_size, overwrite, compression, compression_level, mode, window, index)",
        ),
        (VALID.replace("piles: 4", "seed: 1"), "output.piles: missing (required)"),
        (
            VALID.replace("piles: 4", "piles: 4, max_pile_bytes: lots"),
            "output.max_pile_bytes: expected a size like 2GiB or 500MB, got 'lots'",
        ),
        (VALID.replace("piles: 4", "piles: 4, overwrite: 'yes'"), "output.overwrite: expected true or false, got 'yes'"),
        (VALID.replace("path: out, ", ""), "output.path: missing (required)"),
        (VALID + "workers: two\n", "workers: expected an integer >= 1, got 'two'"),
        (VALID + "on_error: ignore\n", "on_error: expected one of raise, skip, got 'ignore'"),
        (
            VALID + "colour: blue\n",
            "colour: unknown field (expected one of: job, inputs, transform, fn, args, output, resume, workers, on_error, key_prefix, executor, ray_address, repeat, storage_options)",
        ),
        (  # only the fields of its own kind: not preprocess's transform and fn, nor the demo's samples
            "job: pile\ninputs: data/a.jsonl\noutput: {path: o, piles: 2}\nbogus: 1\n",
            "bogus: unknown field (expected one of: job, inputs, output, format, args, resume, workers, on_error, key_prefix, executor, ray_address, repeat, storage_options)",
        ),
        (
            VALID + "samples: 3\n",
            "samples: unknown field (expected one of: job, inputs, transform, fn, args, output, resume, workers, on_error, key_prefix, executor, ray_address, repeat, storage_options)",
        ),
        (VALID.replace("inputs: data/*.jsonl", "inputs: []"), "inputs: expected a path or a non-empty list of paths, got a list"),
        (VALID.replace("inputs: data/*.jsonl", "inputs: [data/a.jsonl, 3]"), "inputs[1]: expected a path, got 3"),
        (VALID.replace("data/*.jsonl", "data/*.csv"), "inputs[0]: {dir}/data/*.csv: pattern matches no file"),
        (VALID.replace("job: preprocess", "job: train"), "job: expected one of preprocess, pile, shuffle, demo, got 'train'"),
        (VALID.replace("job: preprocess", ""), "job: missing (required)"),
        (VALID.replace("transform: jsonl", "transform: audio"), "transform: expected one of images, jsonl, shards, got 'audio'"),
        (VALID.replace("transform: jsonl", ""), "transform: missing: name a built-in (images, jsonl, shards) or give fn: module:function"),
        (VALID + "fn: myprep:make\n", "fn: give either fn (your own function) or transform (a built-in), not both"),
        (VALID + "args: {colour: 1}\n", "args.colour: unknown argument for transform 'jsonl' (expected one of: key)"),
        (IMAGES + "args: {size: big}\n", "args.size: expected an integer >= 0, got 'big'"),
        (
            IMAGES.replace("inputs: images", "inputs: imagez"),
            "inputs[0]: {dir}/imagez: no such folder: an image transform reads a folder of one subfolder per class",
        ),
        (
            IMAGES.replace("inputs: images", "inputs: data/a.jsonl"),
            "inputs[0]: {dir}/data/a.jsonl: a file, not a folder: an image transform reads a folder of one subfolder per class",
        ),
        ("- job: preprocess\n", "expected a mapping of options, got a list"),
        ("", "expected a mapping of options, got nothing"),
        ("job: demo\nsamples: -5\n", "samples: expected an integer >= 1, got -5"),
        ("job: demo\nsamples: 100\n", "samples: expected at least 256 (one batch of the classes-per-batch figure), got 100"),
        (
            "job: shuffle\ninputs: data/a.jsonl\noutput: {path: o, maxcount: ten}\n",
            "output.maxcount: expected an integer >= 1 or None, got 'ten'",
        ),
        (
            "job: shuffle\ninputs: data/a.jsonl\noutput: {path: o, maxsize: 1 GB}\nworkers: 0\n",
            "workers: expected an integer >= 1, got 0",
        ),
        (
            "job: shuffle\ninputs: data/a.jsonl\noutput: {path: o, memory: 1000}\n",
            "output.memory: expected at least 1536 bytes (a member header and the end-of-archive marker), got 1000",
        ),
        (
            "job: pile\ninputs: data/a.jsonl\noutput: {path: o, piles: 2, memory: 1MiB}\n",
            "output.memory: unknown field (expected one of: path, piles, seed, max_pile_bytes, buffer_size, overwrite, compression, compression_level, mode, window, index)",
        ),
    ],
)
def test_each_mistake_is_named_by_field(job_dir, text, message):
    assert _error(job_dir, text) == message.format(dir=job_dir)


def test_object_tags_are_refused(job_dir):
    message = _error(job_dir, VALID + "args: !!python/object/apply:os.system ['echo hacked']\n")
    assert message.startswith("line 6: YAML tags that build Python objects are not allowed")


def test_bad_yaml_names_line_and_column(job_dir):
    assert _error(job_dir, "job: preprocess\noutput: {path: out\n").startswith("line 3, column 1: not valid YAML")


def test_a_key_given_twice_is_refused(job_dir):
    # YAML keeps the last value of a repeated key: the first inputs would be dropped unsaid
    text = "job: shuffle\ninputs: data/a.jsonl\ninputs: data/b.jsonl\noutput: {path: o}\n"
    assert _error(job_dir, text) == "line 3, column 1: not valid YAML (key 'inputs' given twice, first on line 2)"
    message = _error(job_dir, "job: shuffle\ninputs: data/a.jsonl\noutput: {path: o, maxcount: 4, maxcount: 8}\n")
    assert message.startswith("line 3, column 32: not valid YAML (key 'maxcount' given twice")


def test_a_file_of_several_jobs_is_refused_naming_the_second(job_dir):
    text = "job: demo\nsamples: 300\n---\njob: demo\nsamples: 400\n"
    assert _error(job_dir, text) == (
        "line 3, column 1: a job file holds one job, and a second YAML document ('---') starts here; "
        "put each job in a file of its own and run each"
    )


def test_yaml_that_repeats_no_key_as_written_loads_as_yaml_reads_it():
    from shardkit.cli.job_yaml import load_yaml

    # a merge key's values may be overridden, also through a mapping aliased later; '=' is a key like any
    text = "base: &base {x: 1}\nout: {<<: &d {<<: *base, x: 2}, p: o}\nother: *d\n'=': 1\n"
    assert load_yaml(text, "job.yaml") == yaml.safe_load(text)
    with pytest.raises(
        shardkit.ConfigError, match=r"job\.yaml: line 2, column 11: not valid YAML \(key 'x' given twice, first on line 2\)"
    ):
        load_yaml("a: 1\nb: {x: 1, x: 2}\n", "job.yaml")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "nosuchmodule_xyz:make",
            "fn: cannot import module 'nosuchmodule_xyz' for 'nosuchmodule_xyz:make': No module named 'nosuchmodule_xyz'",
        ),
        ("myprep:nothing", "fn: module 'myprep' ({dir}/myprep.py) has no attribute 'nothing'"),
        ("myprep:value", "fn: 'myprep:value' is a int, not a function"),
        ("broken:make", "fn: importing module 'broken' for 'broken:make' failed: SyntaxError: invalid syntax (broken.py, line 1)"),
        ("myprep.make", "fn: expected 'module:function' (e.g. mypackage.prep:make_samples), got 'myprep.make'"),
    ],
)
def test_fn_that_cannot_be_imported(job_dir, spec, message):
    text = VALID.replace("transform: jsonl", f"fn: {spec}")
    assert _error(job_dir, text) == message.format(dir=job_dir)


def test_fn_next_to_the_job_file_is_imported_with_its_args(job_dir):
    job = load_job(_write(job_dir, VALID.replace("transform: jsonl", "fn: myprep:make\nargs: {scale: 5}")))
    assert isinstance(job, PreprocessJob) and job.fn == ImportedFn("myprep:make", {"scale": 5}, search=str(job_dir))
    assert list(job.fn("unit")) == [{"__key__": "k", "txt": "5"}]


def test_other_job_kinds_parse(job_dir):
    job = load_job(_write(job_dir, "job: shuffle\ninputs: [data/a.jsonl]\noutput: {path: o, maxsize: 1GB}\nworkers: 2\n"))
    assert isinstance(job, ShuffleJob) and job.options == shardkit.ShuffleOptions(maxsize=10**9, workers=2)
    job = load_job(_write(job_dir, "job: pile\ninputs: data/a.jsonl\noutput: {path: o, piles: 3, seed: 7}\non_error: skip\n"))
    assert isinstance(job, PileJob) and job.options == shardkit.PileOptions(piles=3, seed=7, on_error="skip") and job.on_error == "skip"
    job = load_job(_write(job_dir, "job: preprocess\ninputs: images\ntransform: images\nargs: {size: 32}\noutput: {path: o, piles: 3}\n"))
    assert isinstance(job, PreprocessJob) and job.fn == Images(size=32)


def test_cli_check_and_errors(job_dir, capsys):
    path = _write(job_dir, VALID)
    assert main(["run", "--check", path]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok: preprocess job: 1 input pattern(s) -> {job_dir}/out (4 piles)"
    assert not os.path.exists(job_dir / "out")
    _write(job_dir, VALID.replace("piles: 4", "piles: sixty"))
    assert main(["run", path]) == 1
    captured = capsys.readouterr()
    assert (
        captured.err == f"shardkit run: error: {path}: line 5: output.piles: expected an integer >= 1, got 'sixty'\n" and captured.out == ""
    )
    assert main(["run", "--check", str(job_dir / "nope.yaml")]) == 1
    assert "no such job file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 2


def test_shuffle_job_runs(job_dir, dataset, capsys):
    text = f"job: shuffle\ninputs: {dataset}/pile-*.tar\noutput: {{path: shuffled, piles: 3, maxcount: 64}}\n"
    path = _write(job_dir, text)
    assert main(["run", "-q", path]) == 0
    m = shardkit.manifest.read(str(job_dir / "shuffled"))
    assert m.samples == 200 and [p.samples for p in m.piles] == [64, 64, 64, 8]
    with pytest.raises(shardkit.DatasetExistsError):
        run_job(load_job(path), quiet=True)


def test_a_job_whose_output_holds_a_dataset_says_what_to_set_in_the_job_file(job_dir, dataset, capsys):
    text = f"job: shuffle\ninputs: {dataset}/pile-*.tar\noutput: {{path: shuffled, piles: 3, maxcount: 64}}\n"
    path = _write(job_dir, text)
    assert main(["run", "-q", path]) == 0
    seen = (job_dir / "shuffled" / "shardkit.json").read_bytes()
    for check in (["--check"], []):  # --check finds it before any work, as the run does
        assert main(["run", "-q", *check, path]) == 1
        said = capsys.readouterr().err
        assert said == (
            f"shardkit run: error: {path}: output.path: {job_dir}/shuffled: already holds a shardkit dataset; "
            "set 'overwrite: true' under output to replace it\n"
        )
    assert (job_dir / "shuffled" / "shardkit.json").read_bytes() == seen
    _write(job_dir, text.replace("maxcount: 64", "maxcount: 64, overwrite: true"))
    assert main(["run", "-q", "--check", path]) == 0 and main(["run", "-q", path]) == 0
    pile_job = f"job: pile\ninputs: {dataset}/pile-*.tar\noutput: {{path: piled, piles: 2}}\n"
    assert main(["run", "-q", _write(job_dir, pile_job)]) == 0
    assert main(["run", "-q", path]) == 1  # the same job again
    assert "'overwrite: true' under output to replace it, or 'mode: append' to add to it" in capsys.readouterr().err
    assert main(["run", "-q", "--check", _write(job_dir, pile_job.replace("piles: 2", "piles: 2, mode: append"))]) == 0
    nowhere = _write(job_dir, pile_job.replace("path: piled, piles: 2", "path: nowhere, piles: 2, mode: append"))
    capsys.readouterr()
    assert main(["run", "-q", "--check", nowhere]) == 1  # nothing to append to: found before any work
    assert f"{nowhere}: output.path: {job_dir}/nowhere: no shardkit dataset to append to; drop 'mode: append'" in capsys.readouterr().err


def test_fn_job_runs_in_worker_processes(job_dir):
    (job_dir / "data" / "b.jsonl").write_text('{"x": 3}\n')
    (job_dir / "gen_in_workers.py").write_text(
        "import os\n\ndef make(unit, scale=1):\n    yield {'__key__': os.path.basename(unit)[0], 'txt': str(scale)}\n"
    )
    text = VALID.replace("transform: jsonl", "fn: gen_in_workers:make\nargs: {scale: 2}") + "workers: 2\n"
    m = run_job(load_job(_write(job_dir, text)), quiet=True)
    assert (m.samples, len(m.piles), m.fields) == (2, 4, ("txt",))
    out = str(job_dir / "out")
    got = sorted((s["__key__"], s["txt"]) for p in m.piles for s in iter_shard(os.path.join(out, p.name)))
    assert got == [("a", b"2"), ("b", b"2")]


def test_a_failed_job_leaves_no_output_folder_and_runs_once_its_input_is_mended(job_dir, capsys):
    (job_dir / "data" / "b.jsonl").write_text("not json\n")
    path = _write(job_dir, VALID)
    assert main(["run", "-q", path]) == 1
    assert "b.jsonl" in capsys.readouterr().err
    assert not (job_dir / "out").exists()
    (job_dir / "data" / "b.jsonl").write_text('{"x": 3}\n')
    assert main(["run", "-q", path]) == 0
    assert shardkit.manifest.read(str(job_dir / "out")).samples == 3


def test_skip_policy_counts_failing_units(job_dir):
    (job_dir / "data" / "b.jsonl").write_text("not json\n")
    m = run_job(load_job(_write(job_dir, VALID + "on_error: skip\n")), quiet=True)
    assert (m.samples, m.skipped_units) == (2, 1)


def test_the_executor_is_a_mapping_or_flat_keys(job_dir):
    nested = load_job(_write(job_dir, VALID + "executor: {kind: ray, address: auto}\n"))
    flat = load_job(_write(job_dir, VALID + "executor: ray\nray_address: auto\n"))
    assert nested.options == flat.options == shardkit.PileOptions(piles=4, executor="ray", ray_address="auto")
    assert load_job(_write(job_dir, VALID + "executor: {kind: ray}\n")).options.ray_address is None
    assert _error(job_dir, VALID + "executor: {kind: spark}\n") == "executor.kind: expected one of local, ray, got 'spark'"
    assert _error(job_dir, VALID + "executor: {kind: ray, host: a}\n").startswith("executor.host: unknown field")
    assert "give the address once" in _error(job_dir, VALID + "executor: {kind: ray, address: auto}\nray_address: auto\n")
    assert _error(job_dir, VALID + "executor: local\nray_address: auto\n").startswith("ray_address: only used with executor='ray'")


def test_a_resume_job_whose_output_holds_a_finished_dataset_says_what_to_set_in_the_job_file(job_dir, capsys):
    path = _write(job_dir, VALID + "resume: true\n")
    assert main(["run", "-q", path]) == 0  # resume: true with nothing to resume runs the job
    seen = (job_dir / "out" / "shardkit.json").read_bytes()
    for check in (["--check"], []):  # run again: a dataset and no stopped job to continue
        assert main(["run", "-q", *check, path]) == 1
        assert capsys.readouterr().err == (
            f"shardkit run: error: {path}: output.path: {job_dir}/out: already holds a shardkit dataset and no stopped job "
            "to resume; set 'overwrite: true' under output to replace it, or 'mode: append' to add to it\n"
        )
    assert (job_dir / "out" / "shardkit.json").read_bytes() == seen


def test_a_job_whose_output_holds_a_stopped_pass_1_says_what_to_set_in_the_job_file(job_dir, monkeypatch, capsys):
    (job_dir / "data" / "b.jsonl").write_text('{"x": 3}\n')
    path = _write(job_dir, VALID)
    with monkeypatch.context() as patch:  # Ctrl-C as the merge begins: the units are committed
        patch.setattr(publish, "finish_pile", lambda work: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            run_job(load_job(path), quiet=True)
    for check in (["--check"], []):
        assert main(["run", "-q", *check, path]) == 1
        assert capsys.readouterr().err == (
            f"shardkit run: error: {path}: output.path: {job_dir}/out: holds a stopped job (2 of 2 input units done); "
            "set 'resume: true' to continue it, or 'overwrite: true' under output to discard it\n"
        )
    assert main(["run", "-q", _write(job_dir, VALID + "resume: true\n")]) == 0
    assert shardkit.manifest.read(str(job_dir / "out")).samples == 3


def test_a_job_into_an_object_store_that_holds_a_dataset_says_what_to_set_in_the_job_file(job_dir, s3, capsys):
    path = _write(job_dir, VALID.replace("path: out", f"path: {s3.url('out')}"))
    assert main(["run", "-q", path]) == 0
    for check in (["--check"], []):
        assert main(["run", "-q", *check, path]) == 1
        assert capsys.readouterr().err == (
            f"shardkit run: error: {path}: output.path: {s3.url('out')}: already holds a shardkit dataset; "
            "set 'overwrite: true' under output to replace it, or 'mode: append' to add to it\n"
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (VALID.replace("piles: 4", "piles: sixty"), "line 5: output.piles: expected an integer >= 1, got 'sixty'"),
        (VALID + "workers: two\n", "line 6: workers: expected an integer >= 1, got 'two'"),
        (VALID + "colour: blue\n", "line 6: colour: unknown field"),
        (VALID + "key_prefix: unit\n", "line 6: key_prefix: preprocess takes sample keys from its function"),  # not when it runs
        (VALID.replace("piles: 4", "seed: 1"), "line 5: output.piles: missing (required)"),  # the line of its mapping
        ("job: pile\ninputs:\n  - data/a.jsonl\n  - 3\noutput: {path: o, piles: 2}\n", "line 4: inputs[1]: expected a path, got 3"),
        (VALID.replace("data/*.jsonl", "data/*.csv"), "line 3: inputs[0]: {dir}/data/*.csv: pattern matches no file"),
        (VALID + "fn: myprep:make\n", "line 6: fn: give either fn"),
        ("job: demo\nsamples: 100\n", "line 2: samples: expected at least 256"),
        ("base: &b {piles: sixty}\njob: pile\ninputs: data/a.jsonl\noutput: {path: o, <<: *b}\n", "line 1: base: unknown field"),
        (VALID.replace("job: preprocess", ""), "job: missing (required)"),  # nowhere to point at
        ("", "expected a mapping of options, got nothing"),
    ],
)
def test_each_mistake_names_its_line(job_dir, text, message):
    path = _write(job_dir, text)
    with pytest.raises(shardkit.ConfigError) as info:
        load_job(path)
    assert str(info.value).startswith(f"{path}: {message.format(dir=job_dir)}")


def test_a_job_whose_output_is_a_file_says_so_before_any_work(job_dir, capsys):
    path = _write(job_dir, VALID.replace("path: out", "path: data/a.jsonl"))
    for check in (["--check"], []):
        assert main(["run", "-q", *check, path]) == 1
        assert capsys.readouterr().err == (
            f"shardkit run: error: {path}: output.path: {job_dir}/data/a.jsonl: a file, not a folder: name the folder the dataset goes in\n"
        )
    assert (job_dir / "data" / "a.jsonl").read_text() == '{"x": 1}\n{"x": 2}\n'


@pytest.mark.parametrize(("kind", "stray"), [("pile", "pile-000000.tar"), ("shuffle", "shard-000000.tar")])
def test_a_job_whose_output_holds_stray_files_says_what_to_set_in_the_job_file(job_dir, dataset, capsys, kind, stray):
    (job_dir / "out").mkdir()
    (job_dir / "out" / stray).write_bytes(b"someone else's")
    piles = "piles: 2" if kind == "pile" else "maxcount: 64"
    path = _write(job_dir, f"job: {kind}\ninputs: {dataset}/pile-*.tar\noutput: {{path: out, {piles}}}\n")
    for check in (["--check"], []):
        assert main(["run", "-q", *check, path]) == 1
        assert capsys.readouterr().err == (
            f"shardkit run: error: {path}: output.path: {job_dir}/out: holds {stray} but no shardkit.json, so it is not a "
            "shardkit dataset; use an empty folder, or set 'overwrite: true' under output to write the dataset beside "
            "such files (they are left as they are)\n"
        )
    _write(job_dir, f"job: {kind}\ninputs: {dataset}/pile-*.tar\noutput: {{path: out, {piles}, overwrite: true}}\n")
    assert main(["run", "-q", path]) == 0
    assert (job_dir / "out" / stray).read_bytes() == b"someone else's"


def test_a_shuffle_job_takes_the_executor_as_a_mapping_too(job_dir):
    # docs/clusters.md: executor: {kind: ray, address: auto} in a pile, preprocess or shuffle job
    shuffle = "job: shuffle\ninputs: data/a.jsonl\noutput: {path: o}\n"
    nested = load_job(_write(job_dir, shuffle + "executor: {kind: ray, address: auto}\n"))
    flat = load_job(_write(job_dir, shuffle + "executor: ray\nray_address: auto\n"))
    assert isinstance(nested, ShuffleJob) and nested.options == flat.options
    assert (nested.options.executor, nested.options.ray_address) == ("ray", "auto")
    assert _error(job_dir, shuffle + "executor: {kind: spark}\n") == "executor.kind: expected one of local, ray, got 'spark'"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ("*.jsonl", "line 3, column 10: not valid YAML (expected alphabetic or numeric character, but found '.')"),
        ("[*.jsonl, data/a.jsonl]", "line 3, column 11: not valid YAML (expected alphabetic or numeric character, but found '.')"),
        ("*data", "line 3, column 9: not valid YAML (found undefined alias 'data')"),
    ],
)
def test_a_glob_read_as_a_yaml_alias_is_said_to_need_quotes(job_dir, inputs, message):
    text = VALID.replace("inputs: data/*.jsonl", f"inputs: {inputs}")
    assert _error(job_dir, text) == f"{message}; a value that starts with * is a YAML alias: quote a glob (inputs: '*.tar')"


def test_a_brace_pattern_read_as_a_yaml_mapping_is_said_to_need_quotes(job_dir):
    text = VALID.replace("inputs: data/*.jsonl", "inputs: {data/a.jsonl,data/b.jsonl}")
    assert _error(job_dir, text) == (
        "inputs: expected a path or a non-empty list of paths, got a mapping "
        "(a value that starts with { is a YAML mapping: quote a brace pattern, inputs: '{a,b}.tar')"
    )


def test_a_job_file_that_is_not_utf8_names_the_line(job_dir):
    path = job_dir / "job.yaml"
    path.write_bytes(b"job: pile\ninputs: caf\xe9/*.tar\noutput: {path: o, piles: 2}\n")
    with pytest.raises(shardkit.ConfigError) as info:
        load_job(str(path))
    assert str(info.value) == f"{path}: line 2, column 12: not UTF-8 text (byte 0xe9); save the job file as UTF-8"


def test_a_resume_of_another_job_says_how_to_start_over_in_the_job_file_too(job_dir, monkeypatch, capsys):
    (job_dir / "data" / "b.jsonl").write_text('{"x": 3}\n')
    path = _write(job_dir, VALID)
    with monkeypatch.context() as patch:  # Ctrl-C as the merge begins: the units are committed
        patch.setattr(publish, "finish_pile", lambda work: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            run_job(load_job(path), quiet=True)
    assert main(["run", "-q", _write(job_dir, VALID.replace("piles: 4", "piles: 3") + "resume: true\n")]) == 1
    said = capsys.readouterr().err
    assert "cannot resume" in said and "piles was 4, is 3" in said
    assert said.rstrip().endswith("or pass overwrite=True (--overwrite, YAML overwrite: true under output) to start over")


@pytest.mark.parametrize("inputs", ["{data/a,data/b}.jsonl", "[{data/a,data/b}.jsonl]"])
def test_a_brace_pattern_with_a_suffix_is_said_to_need_quotes(job_dir, inputs):
    """``{a,b}.tar`` is no mapping YAML reads but one it cannot parse: its error says no more than a token was found."""
    text = VALID.replace("inputs: data/*.jsonl", f"inputs: {inputs}")
    assert _error(job_dir, text).endswith("; a value that starts with { is a YAML mapping: quote a brace pattern (inputs: '{a,b}.tar')")


def test_paths_take_environment_variables_and_an_unset_one_is_named(job_dir, dataset, capsys, monkeypatch):
    monkeypatch.setenv("SK_DATA", str(dataset))
    monkeypatch.setenv("SK_OUT", "made")
    monkeypatch.delenv("SK_UNSET", raising=False)
    text = "job: shuffle\ninputs: $SK_DATA/pile-*.tar\noutput: {path: '${SK_OUT}/a$$b', piles: 3}\n"
    job = load_job(_write(job_dir, text))
    assert job.inputs == (f"{dataset}/pile-*.tar",) and job.output == str(job_dir / "made" / "a$b")
    monkeypatch.setenv("SK_EMPTY", "")
    bad = {
        "line 2: inputs[0]: $SK_UNSET/pile-*.tar: $SK_UNSET is not set in the environment": text.replace("$SK_DATA", "$SK_UNSET"),
        "line 3: output.path: ${SK_UNSET}/x: $SK_UNSET is not set in the environment": text.replace("${SK_OUT}/a$$b", "${SK_UNSET}/x"),
        "line 3: output.path: $SK_EMPTY/x: $SK_EMPTY is set but empty in the environment": text.replace("${SK_OUT}/a$$b", "$SK_EMPTY/x"),
        "line 3: output.path: ${SK_OUT:-x}/y: a ${ that is not ${NAME}": text.replace("${SK_OUT}/a$$b", "${SK_OUT:-x}/y"),
        "line 3: output.path: ${}/y: a ${ that is not ${NAME}": text.replace("${SK_OUT}/a$$b", "${}/y"),
        "; inside { } (a flow mapping) a ${NAME} path must be quoted": text.replace("'${SK_OUT}/a$$b'", "${SK_OUT}/a"),
    }
    for said, spoiled in bad.items():
        assert main(["run", "--check", _write(job_dir, spoiled)]) == 1
        err = capsys.readouterr().err
        assert said in err, err
    assert not os.path.exists(job_dir / "$SK_UNSET") and not os.path.exists(job_dir / "${SK_UNSET}")
    digits = load_job(_write(job_dir, text.replace("${SK_OUT}/a$$b", "out$1")))  # no name starts with a digit: a dollar sign
    assert digits.output == str(job_dir / "out$1")
