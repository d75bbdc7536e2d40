"""Measuring a dataset: the scan, the loader's plan as an order, the comparison and the CLI."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys

import numpy as np
import pytest
from conftest import make_samples

import shardkit
from shardkit.cli import main
from shardkit.errors import ConfigError
from shardkit.loading.pile import read_pile
from shardkit.piles import router
from shardkit.tools import quality
from shardkit.tools.compare import DatasetIndex, _natural, compare_shuffles, natural_order, order_from_plan, scan_dataset


def test_scan_reads_source_positions_and_labels(dataset):
    index = scan_dataset(dataset, label_field="cls")
    m = shardkit.manifest.read(dataset)
    assert index.samples == 200 and list(index.counts) == [p.samples for p in m.piles]
    assert sorted(index.source.tolist()) == list(range(200))
    assert index.by_source(index.labels).tolist() == [i * 10 // 200 for i in range(200)]
    # the first sample of each pile was written first among its pile-mates: keys are in source order
    offsets = np.concatenate(([0], np.cumsum(index.counts)))
    for lo, hi in itertools.pairwise(offsets):
        assert np.all(np.diff(index.source[lo:hi]) > 0)


def test_scan_uses_natural_key_order_and_source_field(tmp_path):
    keys = ["img9", "img10", "img100", "img2"]  # natural order: img2 img9 img10 img100
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=2, seed=0) as w:
        for k in keys:
            w.write({"__key__": k, "txt": "x", "id": 100 - int(k[3:])})
    index = scan_dataset(out)
    by_key = dict(zip(_keys_in_manifest_order(out), index.source.tolist(), strict=True))
    assert by_key == {"img2": 0, "img9": 1, "img10": 2, "img100": 3}
    by_field = dict(zip(_keys_in_manifest_order(out), scan_dataset(out, source_field="id").source.tolist(), strict=True))
    assert by_field == {"img100": 0, "img10": 1, "img9": 2, "img2": 3}
    with pytest.raises(ConfigError, match="must hold integers"):
        scan_dataset(out, source_field="txt")


def test_a_source_field_that_is_not_an_integer_names_the_sample_and_a_short_value(tmp_path):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=1, seed=0) as w:
        w.write({"__key__": "a", "id": 1, "bin": b"7"})
        w.write({"__key__": "b", "id": 2, "bin": b"\xff\xd8" + bytes(5000)})
    with pytest.raises(ConfigError) as error:
        scan_dataset(out, source_field="bin")
    message = str(error.value)
    assert message.startswith(f"{out}: source_field 'bin' must hold integers: sample 'b' holds b'\\xff\\xd8")
    assert len(message) < 200  # the value is shown short, not 5000 bytes of it


@pytest.mark.parametrize(
    "keys",
    [
        ["img9", "img10", "img100", "img2"],
        ["a1b22", "a12b2"],  # same length, digits elsewhere: string order would be wrong
        ["b09", "a10", "a09"],
        ["x", "y10", "y9", ""],
        [f"s{i:07d}" for i in np.random.default_rng(0).permutation(3000)],
        [f"dir/{i}/k{j}" for i in range(12) for j in range(12)][::-1],
    ],
)
def test_natural_order(keys):
    assert [keys[i] for i in natural_order(keys)] == sorted(keys, key=_natural)


def _keys_in_manifest_order(directory: str) -> list[str]:
    m = shardkit.manifest.read(directory)
    return [k for p in m.piles for k in read_pile(os.path.join(directory, p.name)).keys]


def test_scan_errors_name_the_field_and_the_pile(tmp_path, dataset):
    with pytest.raises(ConfigError, match=r"label_field 'label' is not a field of this dataset \(fields: bin, cls\)"):
        scan_dataset(dataset, label_field="label")
    out = str(tmp_path / "partial")
    with shardkit.PileWriter(out, piles=1, seed=0) as w:
        w.write({"__key__": "a", "bin": b"1", "cls": 1})
        w.write({"__key__": "b", "bin": b"2"})
    with pytest.raises(ConfigError, match=r"pile-000000.tar: sample 'b' has no 'cls' field"):
        scan_dataset(out, label_field="cls")


def test_order_from_plan_is_the_loaders_permutation():
    counts = [5, 0, 7, 3]
    ids = order_from_plan(counts, seed=1, epoch=0)
    assert sorted(ids.tolist()) == list(range(15))
    assert not np.array_equal(ids, order_from_plan(counts, seed=1, epoch=1))
    assert np.array_equal(order_from_plan(counts, shuffle=False), np.arange(15))
    # each pile is read as one contiguous run with mix=1
    pile_of = np.repeat(np.arange(4), counts)[ids]
    assert np.count_nonzero(np.diff(pile_of)) == 2
    index = DatasetIndex(counts=np.array(counts), source=np.arange(15)[::-1].copy())
    assert np.array_equal(order_from_plan(index, seed=1, epoch=0), 14 - ids)


def _piled_index(n: int, piles: int, seed: int = 1) -> DatasetIndex:
    """What a pass-1 dataset of n samples in source order looks like, without writing it.

    The pile of each sample is drawn by the writer's own router; inside a pile samples keep source
    order, as the writer appends them. So sample j in manifest order has source position ids[j].
    """
    pile = router.route(piles=piles, seed=seed, unit=0, count=n)
    return DatasetIndex(counts=np.bincount(pile, minlength=piles), source=np.argsort(pile, kind="stable"))


@pytest.mark.parametrize("mix", [1, 4])
def test_plan_moments_are_uniform_for_large_n(mix):
    n = 1_000_000
    index = _piled_index(n, 100)
    labels = np.arange(n) * 10 // n
    for seed in (0, 1):
        report = quality.measure(order_from_plan(index, seed=seed, epoch=seed, mix=mix), labels=labels, batch_size=256)
        for key in ("spearman_rho", "kendall_tau", "displacement_mean", "classes_per_batch", "dispersion"):
            assert abs(report[key].z) < 4, (seed, report[key])
        assert abs(report["displacement_median"].value - quality.MEDIAN_UNIFORM) < 0.002


def test_plan_on_class_sorted_data_has_dispersion_within_10_percent_of_1():
    # 100 classes in source order, batches of 64: ~310 batches put the ratio's sd near 0.008
    n = 20_000
    index = _piled_index(n, 16, seed=2)
    labels = np.arange(n) * 100 // n
    for seed in range(3):
        value = quality.measure(order_from_plan(index, seed=seed), labels=labels, batch_size=64)["dispersion"].value
        assert abs(value - 1) < 0.1


def _recurrence(index: DatasetIndex, mix: int, seeds=(0, 1), epochs: int = 4, batch: int = 64) -> float:
    ratios = []
    for seed in seeds:
        orders = [order_from_plan(index, seed=seed, epoch=e, mix=mix) for e in range(epochs)]
        ratios.append(quality.measure(orders, batch_size=batch)["recurrence"].value)
    return float(np.mean(ratios))


def test_recurrence_is_about_m_and_mix_cuts_it():
    piles = 50
    index = _piled_index(200_000, piles)
    fixed = _recurrence(index, 1)
    # pile-mates meet again: about M times the pairs of fresh shuffles (batches at pile seams take a bit off)
    assert 0.9 * piles < fixed < 1.05 * piles
    for k in (2, 4, 8):
        # mix=k spreads a pile as a trapezoid over k + 1 piles' worth of positions: the chance that
        # two batch-mates are pile-mates, and that pile-mates share a batch, each shrink by
        # (k - 1/3) / k^2, so the pairs beyond those of fresh shuffles shrink by its square
        # (measured within 3% here: cuts of 5.2, 14 and 29 for k = 2, 4, 8)
        expected = 1 + (fixed - 1) * ((k - 1 / 3) / k**2) ** 2
        assert abs(_recurrence(index, k) / expected - 1) < 0.15, k


def test_compare_shuffles_reports_three_orders(dataset, tmp_path):
    result = compare_shuffles(dataset, batch_size=16, epochs=3, seed=4)
    names = [r.name for r in result.reports]
    assert names == ["shardkit", "sequential", "webdataset"]
    shard, seq, wds = result.reports
    assert seq["kendall_tau"].value == 1.0 and seq["dispersion"].value > 5
    assert abs(shard["kendall_tau"].z) < 4
    # sequential epochs are identical: every co-batched pair meets again
    assert seq["recurrence"].value == pytest.approx(200 * 199 / (12 * 16 * 15), rel=1e-9)
    assert "shards_per_window" in wds
    text = result.table()
    assert "shardkit" in text and "webdataset" in text and "co-batch recurrence" in text
    png = tmp_path / "q.png"
    if importlib.util.find_spec("matplotlib") is None:  # the plot extra is optional: say so clearly
        with pytest.raises(ConfigError, match=r"shardkit\[plot\]"):
            result.plot(png)
        return
    result.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_shows_every_order_with_shardkit_on_top(dataset):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'shardkit[plot]')")
    from matplotlib.colors import to_rgba

    from shardkit.tools.plot import draw

    result = compare_shuffles(dataset, batch_size=16, epochs=3, seed=4)
    fig = draw(result)
    scatter, displacement, classes, recurrence = fig.axes
    blue = to_rgba("tab:blue")
    for ax in (classes, recurrence):
        lines = sorted(ax.get_lines(), key=lambda line: line.get_zorder())
        assert len(lines) == 4 and lines[0].get_linestyle() == "--", "the uniform reference, dashed, beneath"
        assert to_rgba(lines[-1].get_color()) == blue, "shardkit's line drawn last, on top"
    assert to_rgba(max(scatter.collections, key=lambda c: c.get_zorder()).get_facecolor()[0])[:3] == blue[:3]
    assert to_rgba(max(displacement.patches, key=lambda p: p.get_zorder()).get_edgecolor()) == blue
    # later-epoch recurrence per pair of epochs, next to the uniform expectation 1
    reference, *orders = sorted(recurrence.get_lines(), key=lambda line: line.get_zorder())
    assert list(reference.get_ydata()) == [1.0, 1.0]
    shard = result.orders["shardkit"]
    expected = [quality.recurrence(shard[e], shard[e + 1], 16).value for e in (0, 1)]
    assert list(orders[-1].get_ydata()) == pytest.approx(expected)
    assert "later epochs" in recurrence.get_title()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["uniform shuffle", "shardkit", "webdataset", "sequential"]
    one = draw(compare_shuffles(dataset, batch_size=16, epochs=1))
    assert "needs 2 or more epochs" in one.axes[3].texts[0].get_text()
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(one)


def test_compare_rejects_bad_options(dataset):
    with pytest.raises(ConfigError, match="epochs"):
        compare_shuffles(dataset, epochs=0)
    with pytest.raises(ConfigError, match="fewer than one batch"):
        compare_shuffles(dataset, batch_size=1000)
    with pytest.raises(ConfigError, match="source_shards"):
        compare_shuffles(dataset, batch_size=8, source_shards=10_000)
    # a negative seed reached numpy: "ValueError: expected non-negative integer", with a traceback in the CLI
    with pytest.raises(ConfigError, match=r"seed: expected an integer >= 0, got -1"):
        compare_shuffles(dataset, batch_size=8, seed=-1)
    with pytest.raises(ConfigError, match=r"quiet: expected True or False, got 'no'"):
        compare_shuffles(dataset, batch_size=8, quiet="no")
    # a blend is no dataset directory: it was a bare TypeError from os.fspath
    for blend in ({"a": dataset}, shardkit.Blend({"a": dataset})):
        with pytest.raises(ConfigError, match=r"source: expected a shardkit dataset directory or URL, got .*one of its datasets"):
            compare_shuffles(blend, batch_size=8)


def test_cli_quality_refuses_a_negative_seed_in_one_line(dataset, capsys):
    assert main(["quality", dataset, "--batch-size", "8", "--seed", "-1", "-q"]) == 1
    err = capsys.readouterr().err
    assert err == "shardkit quality: error: seed: expected an integer >= 0, got -1\n"


def test_cli_quality_prints_the_table(dataset, capsys):
    assert main(["quality", dataset, "--batch-size", "16", "--epochs", "2", "-q"]) == 0
    out = capsys.readouterr().out
    assert "classes per batch" in out and "sequential" in out
    assert main(["quality", dataset, "--batch-size", "16", "--json", "--mix", "2", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"shardkit mix=2", "sequential", "webdataset"}
    assert doc["sequential"]["metrics"]["spearman_rho"]["value"] == 1.0


def test_cli_quality_errors(dataset, tmp_path, capsys, monkeypatch):
    assert main(["quality", str(tmp_path / "nothing")]) == 1
    assert "nothing: no such directory (expected a shardkit dataset)" in capsys.readouterr().err
    assert main(["quality", dataset, "--label-field", "nope", "--batch-size", "8"]) == 1
    assert "'nope' is not a field" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    assert main(["quality", dataset, "--batch-size", "8", "--plot", str(tmp_path / "x.png")]) == 1
    assert "pip install 'shardkit[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_quality_json_with_plot_keeps_stdout_json(dataset, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'shardkit[plot]')")
    png = tmp_path / "q.png"
    assert main(["quality", dataset, "--batch-size", "16", "--json", "--plot", str(png), "-q"]) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(out)) == {"shardkit", "sequential", "webdataset"}  # `| jq` still reads it
    assert f"wrote {png}" in err and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing/q.png", "--plot: {tmp}/missing/q.png: no such folder {tmp}/missing"),
        ("q.txt", "--plot: {tmp}/q.txt: expected an image file name (.png, .svg, .pdf, ...), got the suffix '.txt'"),
    ],
)
def test_cli_quality_plot_path_is_checked_before_the_work(dataset, tmp_path, capsys, name, message):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'shardkit[plot]')")
    assert main(["quality", dataset, "--batch-size", "8", "--plot", str(tmp_path / name)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # refused before any metric was computed or printed
    assert err == f"shardkit quality: error: {message.format(tmp=tmp_path)}\n"
    assert not (tmp_path / name).exists()


def test_cli_quality_without_labels(tmp_path, capsys):
    out = str(tmp_path / "nolabels")
    with shardkit.PileWriter(out, piles=4, seed=0) as w:
        for s in make_samples(64):
            w.write({"__key__": s["__key__"], "bin": s["bin"]})
    assert main(["quality", out, "--batch-size", "8", "-q"]) == 0
    text = capsys.readouterr().out
    assert "no label field" in text and "dispersion / hypergeom" not in text


def test_quality_of_fewer_samples_than_piles(tmp_path, capsys):
    """Some piles are empty: the reference orders read at most one shard a sample, unasked."""
    out = str(tmp_path / "few")
    with shardkit.PileWriter(out, piles=8, seed=0) as w:
        for s in make_samples(3):
            w.write(s)
    assert len(compare_shuffles(out, batch_size=2).reports) == 3
    assert main(["quality", out, "--batch-size", "2", "-q"]) == 0
    assert "shardkit" in capsys.readouterr().out
