"""Oversampling at pile creation: ``repeat=`` writes copies of samples, each routed on its own."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
from scipy import stats

import shardkit
from shardkit.errors import ConfigError, SampleError
from shardkit.loading.pile import read_pile
from shardkit.piles.repeat import ByField, parse
from shardkit.tools.compare import order_from_plan


def labelled(unit: int):
    for i in range(100):
        yield {"__key__": f"u{unit}-{i:03d}", "cls": i % 4, "txt": f"sample {unit}/{i}"}


def keys_of(directory: str) -> list[str]:
    m = shardkit.manifest.read(directory)
    return [k for p in m.piles for k in read_pile(os.path.join(directory, p.name)).keys]


def test_copies_by_field_get_their_own_keys_and_the_manifest_counts_them(tmp_path):
    m = shardkit.preprocess(range(3), labelled, tmp_path / "o", piles=5, repeat={"field": "cls", "counts": {1: 3, "2": 0}}, quiet=True)
    keys = keys_of(str(tmp_path / "o"))
    assert len(keys) == len(set(keys)) == m.samples == 3 * (25 * 3 + 25 * 0 + 50)
    assert {"u0-001", "u0-001_r1", "u0-001_r2"} <= set(keys) and "u0-002" not in keys and "u0-000_r1" not in keys
    assert m.extra["repeat"] == {
        "rule": {"field": "cls", "counts": {"1": 3, "2": 0}, "default": 1},
        "factors": {"0": 75, "1": 150, "3": 75},
        "input_samples": 300,
        "written_samples": 375,
    }
    # a copy is the sample under another key: the same fields and bytes
    got = {s["__key__"]: s for s in shardkit.loader(tmp_path / "o", decode=False)}
    assert got["u2-005_r2"]["txt"] == got["u2-005"]["txt"] == b"sample 2/5"


def test_copies_are_routed_each_on_its_own_and_identical_for_any_workers(tmp_path):
    rule = parse("cls:0=5")
    one = shardkit.preprocess(range(4), labelled, tmp_path / "a", piles=8, repeat=rule, quiet=True)
    two = shardkit.preprocess(range(4), labelled, tmp_path / "b", piles=8, repeat=rule, workers=2, quiet=True)
    assert one.to_json() == two.to_json()
    for p in one.piles:
        assert (tmp_path / "a" / p.name).read_bytes() == (tmp_path / "b" / p.name).read_bytes()
    # the five copies of a sample are spread over the piles, not kept together
    where = {k: p.name for p in one.piles for k in read_pile(str(tmp_path / "a" / p.name)).keys}
    spread = [len({where[f"u{u}-{i:03d}" + (f"_r{c}" if c else "")] for c in range(5)}) for u in range(4) for i in range(0, 100, 4)]
    assert np.mean(spread) > 3.5  # 8 piles, 5 copies: 4.0 distinct piles expected


def test_the_first_epoch_is_a_uniform_permutation_of_the_copies(tmp_path):
    # a three times, b once: the 4! orders of (a, a_r1, a_r2, b) must come out alike, through
    # the real pass 1 (a seed a run) and the loader's plan
    def fn(unit):
        yield {"__key__": "a", "cls": 3}
        yield {"__key__": "b", "cls": 1}

    out = str(tmp_path / "o")
    seen: Counter[tuple[str, ...]] = Counter()
    runs = 480
    for seed in range(runs):
        shardkit.preprocess([0], fn, out, piles=2, seed=seed, repeat=ByField("cls", {"3": 3}), overwrite=True, quiet=True)
        m = shardkit.manifest.read(out)
        keys = keys_of(out)
        seen[tuple(keys[i] for i in order_from_plan([p.samples for p in m.piles], seed=10**6 + seed, epoch=0))] += 1
    orders = list(itertools.permutations(["a", "a_r1", "a_r2", "b"]))
    observed = np.array([seen[o] for o in orders])
    assert observed.sum() == runs
    assert stats.chisquare(observed).pvalue > 1e-4, seen.most_common(4)


def test_a_callable_rule_and_its_errors_name_the_sample(tmp_path):
    m = shardkit.preprocess(range(2), labelled, tmp_path / "o", piles=3, repeat=lambda s: 2 if s["cls"] == 3 else 1, quiet=True)
    assert m.samples == 250 and m.extra["repeat"]["factors"] == {"1": 150, "2": 50}
    assert m.extra["repeat"]["rule"].endswith("<lambda>")
    with pytest.raises(SampleError, match=r"input unit 0 .*sample 'u0-000': repeat returned: expected a number of copies, an int from 0"):
        shardkit.preprocess(range(2), labelled, tmp_path / "bad", piles=3, repeat=lambda s: -1, quiet=True)
    with pytest.raises(SampleError, match=r"sample 'u0-000': repeat returned: .* got 1.5"):
        shardkit.preprocess(range(2), labelled, tmp_path / "bad", piles=3, repeat=lambda s: 1.5, quiet=True, overwrite=True)
    with pytest.raises(SampleError, match=r"sample 'u0-000': repeat: sample has no field 'label' \(it has \['cls', 'txt'\]\)"):
        shardkit.preprocess(range(2), labelled, tmp_path / "bad", piles=3, repeat="label:1=2", quiet=True, overwrite=True)
    assert not (tmp_path / "bad" / "shardkit.json").exists()


def test_a_failing_rule_skips_the_unit_with_on_error_skip(tmp_path):
    def rule(sample):
        if sample["__key__"].startswith("u1-"):
            raise SampleError("no label for this one")
        return 2

    m = shardkit.preprocess(range(3), labelled, tmp_path / "o", piles=3, repeat=rule, on_error="skip", quiet=True)
    assert m.skipped_units == 1 and m.samples == 400
    assert m.extra["repeat"]["factors"] == {"2": 200}  # the skipped unit's samples are not counted


def test_a_copy_key_that_another_sample_has_is_refused(tmp_path):
    def fn(unit):
        yield {"__key__": "a", "cls": 2}
        yield {"__key__": "a_r1", "cls": 1}

    with pytest.raises(SampleError, match=r"a_r1"):
        shardkit.preprocess([0], fn, tmp_path / "o", piles=2, repeat="cls:2=2", quiet=True)


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ("cls", r"expected FIELD:VALUE=COPIES"),
        ("cls:3", r"'3' is not VALUE=COPIES"),
        ("cls:3=-1", r"'3=-1' is not VALUE=COPIES"),
        ({"field": "cls"}, r"expected \{field: NAME, counts:"),
        ({"field": "cls", "counts": {"3": 4}, "by": 1}, r"unknown: by"),
        ({"field": "", "counts": {"3": 4}}, r"repeat: field: expected the name"),
        ({"field": "cls", "counts": {"3": 20_000}}, r"repeat: counts\['3'\]: expected a number of copies, an int from 0 to 10000"),
        (3, r"repeat: expected a function"),
    ],
)
def test_bad_rules_are_refused_before_anything_runs(tmp_path, rule, said):
    with pytest.raises(ConfigError, match=said):
        shardkit.preprocess(range(2), labelled, tmp_path / "o", piles=3, repeat=rule, quiet=True)
    assert not (tmp_path / "o").exists()


def test_parse_reads_a_default():
    assert parse("cls:3=4,*=0") == ByField("cls", {"3": 4}, 0)
    assert ByField("cls", {"3": 4}, 0)({"cls": b" 3\n"}) == 4 and ByField("cls", {"3": 4}, 0)({"cls": 7}) == 0


def test_pile_repeats_samples_of_tar_shards_by_a_member(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for s in range(2):
        with shardkit.PileWriter(tmp_path / f"w{s}", piles=1) as w:
            for i in range(10):
                w.write({"__key__": f"{i:06d}", "cls": str(i % 2), "txt": f"{s}/{i}"})
        os.rename(tmp_path / f"w{s}" / "pile-000000.tar", src / f"train-{s}.tar")
    m = shardkit.pile(str(src / "*.tar"), tmp_path / "o", piles=3, key_prefix="unit", repeat="cls:1=2", quiet=True)
    keys = set(keys_of(str(tmp_path / "o")))
    assert m.samples == 30 and "train-1/000003_r1" in keys and "train-1/000002_r1" not in keys
    assert m.extra["repeat"]["factors"] == {"1": 10, "2": 10}
    with tarfile.open(tmp_path / "o" / m.piles[0].name) as t:  # still a tar every reader takes
        assert all(name.count(".") == 1 for name in t.getnames())
    # keys that restart in each shard meet without key_prefix: pile's advice names key_prefix
    # (which pile takes), not preprocess's
    with pytest.raises(shardkit.SampleError, match=r"keys must be unique across all inputs\. .*key_prefix='unit'"):
        shardkit.pile(str(src / "*.tar"), tmp_path / "none", piles=3, key_prefix="none", repeat="cls:1=2", quiet=True)


def test_info_and_the_cli_show_the_factors(tmp_path):
    src = tmp_path / "src.tar"
    with shardkit.PileWriter(tmp_path / "w", piles=1) as w:
        for i in range(12):
            w.write({"__key__": f"{i:06d}", "cls": str(i % 3)})
    os.rename(tmp_path / "w" / "pile-000000.tar", src)
    run = [sys.executable, "-m", "shardkit"]
    subprocess.run([*run, "pile", str(src), "-o", str(tmp_path / "o"), "--piles", "2", "--repeat", "cls:0=3,2=0", "-q"], check=True)
    summary = shardkit.info(str(tmp_path / "o"))
    assert summary.samples == 16 and summary.repeat is not None and summary.repeat["factors"] == {"0": 4, "1": 4, "3": 4}
    table = subprocess.run([*run, "info", str(tmp_path / "o")], capture_output=True, text=True, check=True).stdout
    assert "repeat        by cls; 12 samples written as 16: x0 4  x1 4  x3 4" in table
    doc = json.loads(subprocess.run([*run, "info", "--json", str(tmp_path / "o")], capture_output=True, text=True, check=True).stdout)
    assert doc["repeat"]["written_samples"] == 16


def test_a_yaml_job_repeats_by_label(tmp_path):
    (tmp_path / "mod.py").write_text(
        "import os\n\n\ndef fn(unit):\n    for i in range(20):\n"
        "        yield {'__key__': f'{os.path.basename(unit)}-{i}', 'cls': i % 2, 'txt': 'x'}\n"
    )
    for name in "ab":
        (tmp_path / name).write_text("")
    config = tmp_path / "job.yaml"
    config.write_text(
        "job: preprocess\ninputs: [a, b]\nfn: mod:fn\noutput:\n  path: out\n  piles: 3\nrepeat: {field: cls, counts: {1: 3}}\n"
    )
    shardkit.run_job(shardkit.load_job(str(config)), quiet=True)
    m = shardkit.manifest.read(str(tmp_path / "out"))
    assert m.samples == 2 * (10 + 30) and m.extra["repeat"]["factors"] == {"1": 20, "3": 20}
    config.write_text(config.read_text().replace("counts: {1: 3}", "counts: {1: many}"))
    with pytest.raises(ConfigError, match=r"job.yaml.*repeat.*expected a number of copies"):
        shardkit.load_job(str(config))


def test_pile_writer_refuses_repeat(tmp_path):
    with pytest.raises(ConfigError, match=r"repeat: PileWriter writes samples in the calling process"):
        shardkit.PileWriter(tmp_path / "o", options=shardkit.PileOptions(piles=2, repeat="cls:1=2"))


def test_info_names_the_generation_its_repeat_record_describes(tmp_path, capsys):
    from shardkit.cli.main import main

    out = str(tmp_path / "o")

    def row() -> str:
        assert main(["info", out]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("repeat"))

    shardkit.preprocess(range(1), labelled, out, piles=2, repeat={"field": "cls", "counts": {1: 3}}, quiet=True)
    assert row().endswith("100 samples written as 150: x1 75  x3 25")  # one generation: nothing to say which
    shardkit.preprocess(range(1, 2), labelled, out, piles=2, mode="append", quiet=True)  # copies of none
    said = row()
    assert "x1 75  x3 25  (generation 0, the last write that repeated samples; other generations are not counted here)" in said
    shardkit.preprocess(range(2, 3), labelled, out, piles=2, mode="append", window=1, quiet=True)
    assert "(generation 0, since retired by the window, the last write" in row()
    shardkit.preprocess(range(3, 4), labelled, out, piles=2, mode="append", repeat="cls:2=2", quiet=True)
    assert shardkit.info(out).generations == (2, 3)
    assert "100 samples written as 125: x1 75  x2 25  (generation 3, the last write" in row()
    assert shardkit.info(out).repeat["generation"] == 3
    shardkit.preprocess(
        range(4, 5), labelled, out, piles=2, mode="append", repeat={"field": "cls", "counts": {0: 0}, "default": 0}, quiet=True
    )  # copies none
    assert "100 samples written as 0: x0 100  (generation 4, the last write" in row()  # not retired: it wrote no file
