"""shardkit deletes only what it wrote: gc and overwrite (of a grown dataset too) beside user files, tampered manifests, links at staging."""

from __future__ import annotations

import json
import os

import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.dataset import layout
from shardkit.dataset.owned import delete_owned, read_records
from shardkit.dataset.transaction import Dataset

USER_FILES = ["pile-notes.tar", "pile-backup.keys", "pile-000099.tar", "pile-old.tar.gz", "shardkit.g000099.json"]


def _write(out, keys, **options) -> shardkit.Manifest:
    with shardkit.PileWriter(out, piles=2, **options) as w:
        for key in keys:
            w.write({"__key__": key, "bin": key.encode()})
    assert w.manifest is not None
    return w.manifest


def _plant_user_files(out) -> None:
    for name in USER_FILES:
        (out / name).write_bytes(b"the user's " + name.encode())
    (out / "pile-dir.tar").mkdir()
    (out / "pile-dir.tar" / "inside.txt").write_bytes(b"kept")
    (out / "train.py").write_bytes(b"print('hi')")


def _user_files_intact(out) -> None:
    for name in USER_FILES:
        assert (out / name).read_bytes() == b"the user's " + name.encode(), name
    assert (out / "pile-dir.tar" / "inside.txt").read_bytes() == b"kept"
    assert (out / "train.py").read_bytes() == b"print('hi')"


def test_gc_keeps_the_users_files_beside_a_dataset_and_names_them(tmp_path):
    out = tmp_path / "ds"
    _write(out, ["a0", "a1", "a2"])
    _write(out, ["b0"], mode="append", window=1)
    _plant_user_files(out)
    report = shardkit.gc(str(out), grace=0)  # the folder pile-dir.tar sorts before the retired files: no abort
    _user_files_intact(out)
    assert report.deleted and all(n.startswith("pile-00000") or n.startswith("shardkit.g0") for n in report.deleted)
    assert set(USER_FILES) - {"shardkit.g000099.json"} <= set(report.skipped) and "pile-dir.tar" in report.skipped
    assert all(p.name in [*USER_FILES, "pile-dir.tar"] for p in shardkit.verify(str(out), quiet=True))  # at most flagged


def test_overwrite_keeps_the_users_files(tmp_path):
    out = tmp_path / "ds"
    _write(out, ["a0", "a1", "a2"])
    _plant_user_files(out)
    _write(out, ["b0", "b1"], overwrite=True)
    _user_files_intact(out)
    assert manifest.read(str(out)).samples == 2 and not (out / "pile-000000.tar").exists()  # the old dataset's own files went


@pytest.mark.parametrize(
    "name", ["train.py", "shardkit.json", ".shardkit-lock", "../outside.tar", "pile-000000.tar\0x", "sub/pile-000000.tar"]
)
def test_a_tampered_manifest_cannot_make_overwrite_or_gc_delete_anything_else(tmp_path, name):
    out = tmp_path / "ds"
    _write(out, ["a0", "a1", "a2"])
    (out / "train.py").write_bytes(b"print('hi')")
    (tmp_path / "outside.tar").write_bytes(b"outside")
    doc = json.loads((out / "shardkit.json").read_text())
    doc["piles"][0]["name"] = name
    (out / "shardkit.json").write_text(json.dumps(doc))
    with pytest.raises(shardkit.ManifestError, match="pile name"):
        manifest.read(str(out))
    with pytest.raises(shardkit.ManifestError):
        shardkit.gc(str(out), grace=0)
    _write(out, ["b0", "b1"], overwrite=True)  # the old manifest is unreadable: its files are left, nothing else goes
    assert (out / "train.py").read_bytes() == b"print('hi')" and (tmp_path / "outside.tar").read_bytes() == b"outside"
    assert manifest.read(str(out)).samples == 2


def test_a_journal_naming_the_users_files_deletes_none_of_them(tmp_path):
    out = tmp_path / "ds"
    _write(out, ["a0", "a1"])
    (out / "train.py").write_bytes(b"mine")
    (out / "pile-000099.tar").mkdir()
    (out / "shardkit.g000099.json").write_bytes(b"mine")  # a kept manifest's name, not a manifest
    (out / ".shardkit-install-dead.json").write_text(
        json.dumps({"files": ["train.py", "../x", "pile-000099.tar", "shardkit.json"], "delete": ["shardkit.g000099.json"]})
    )
    _write(out, ["b0"], overwrite=True)
    assert (out / "train.py").read_bytes() == b"mine" and (out / "pile-000099.tar").is_dir() and manifest.read(str(out)).samples == 1
    assert (out / "shardkit.g000099.json").read_bytes() == b"mine"


def test_delete_owned_needs_the_layout_and_a_record(tmp_path):
    out = tmp_path / "ds"
    m = _write(out, ["a0", "a1", "a2"])
    (out / "pile-000099.tar").write_bytes(b"x")
    records = read_records(str(out))
    done = delete_owned(str(out), ["pile-000099.tar", "train.py", "shardkit.json", ".shardkit-lock"], reason="a test", records=records)
    assert done.deleted == [] and [n for n, _ in done.skipped] == ["pile-000099.tar", "train.py", "shardkit.json", ".shardkit-lock"]
    done = delete_owned(str(out), [m.piles[0].name], reason="a test", dry_run=True)
    assert done.deleted == [m.piles[0].name] and (out / m.piles[0].name).exists()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("pile-000003.tar", True),
        ("pile-000003-001.v2.tar.zst", True),
        ("pile-000003.g000002-0a1b2c3d.r4-1.v1.tar", True),
        ("shard-000000.tar.gz", True),
        ("pile-000003.keys", False),
        ("shardkit.g000001.json", False),
        ("train.py", False),
        ("pile-notes.tar", False),
        ("pile-000003.tar\n", False),
        ("..pile-000003.tar", False),
    ],
)
def test_a_manifest_names_only_data_files_of_the_layout(name, ok):
    if ok:
        assert layout.check_name(name, "m.json") == name
    else:
        with pytest.raises(shardkit.ManifestError, match=r"m\.json: pile name"):
            layout.check_name(name, "m.json")


@pytest.mark.parametrize("when", ["", "yesterday", "2024-01-01T00:00:00", "2024-13-01T00:00:00+00:00", 5])
def test_a_generation_time_must_be_an_aware_iso_time(tmp_path, when):
    out = tmp_path / "ds"
    _write(out, ["a0"])
    _write(out, ["b0"], mode="append")
    doc = json.loads((out / "shardkit.json").read_text())
    doc["generations"]["0"] = when
    (out / "shardkit.json").write_text(json.dumps(doc))
    with pytest.raises(shardkit.ManifestError, match=r"shardkit.json: field 'generations'"):
        manifest.read(str(out))
    with pytest.raises(shardkit.ManifestError):
        shardkit.gc(str(out), grace=0)


def test_a_link_where_the_staging_should_be_is_an_error_and_its_target_is_untouched(tmp_path):
    victim = tmp_path / "thesis"
    (victim / "sub").mkdir(parents=True)
    (victim / "thesis.tex").write_text("chapter 1")
    (victim / "sub" / "data.csv").write_text("1,2")
    out = tmp_path / "ds"
    out.mkdir()
    os.symlink(victim, out / ".shardkit-pass1")
    with pytest.raises(shardkit.StorageError, match=r"\.shardkit-pass1: is a symbolic link"):
        shardkit.preprocess(range(2), _units, str(out), piles=2, quiet=True)
    assert (victim / "thesis.tex").read_text() == "chapter 1" and (victim / "sub" / "data.csv").read_text() == "1,2"
    assert os.path.islink(out / ".shardkit-pass1")


def _units(unit: int):
    for k in range(3):
        yield {"__key__": f"u{unit:03d}-{k}", "bin": b"x" * 100}


def test_a_remote_outputs_staging_is_private_recorded_and_found_again(s3, tmp_path, monkeypatch):
    import hashlib
    import tempfile

    from shardkit.piles import resume

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    url = s3.url("ds")
    # the name older versions predicted: a link planted there is never followed
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("chapter 1")
    os.symlink(victim, temp / f".shardkit-pass1-{hashlib.sha256(url.encode()).hexdigest()[:16]}")
    seen = {}

    def units(unit):
        if not seen:
            path = resume.staging_path(url)
            seen.update(path=path, mode=os.stat(path).st_mode & 0o777, record=s3.client().cat_file(s3.path("ds/.shardkit-pass1.json")))
        yield from _units(unit)

    shardkit.preprocess(range(2), units, url, piles=2, quiet=True)
    assert seen["mode"] == 0o700 and os.path.basename(seen["path"]).startswith(".shardkit-pass1-")
    assert json.loads(seen["record"])["path"] == seen["path"]
    assert not os.path.exists(seen["path"]) and ".shardkit-pass1.json" not in s3.names("ds")
    assert (victim / "thesis.tex").read_text() == "chapter 1"
    # a kill while it removed its staging leaves a renamed directory: the next job on this machine removes it
    trash = temp / ".shardkit-pass1-abcdefgh-removed-0123abcd"
    trash.mkdir(mode=0o700)
    (trash / "part").write_bytes(b"x")
    (trash / ".shardkit-owner.json").write_text(json.dumps({"dataset": url}))
    shardkit.preprocess(range(2, 4), _units, url, piles=2, mode="append", quiet=True)
    assert not trash.exists() and (victim / "thesis.tex").read_text() == "chapter 1"
    assert sorted(os.listdir(temp)) == [f".shardkit-pass1-{hashlib.sha256(url.encode()).hexdigest()[:16]}"]
    # and so does gc; a directory there without shardkit's record, or another's link, stays
    trash.mkdir(mode=0o700)
    (trash / ".shardkit-owner.json").write_text(json.dumps({"dataset": url}))
    foreign = temp / ".shardkit-staging-abcdefgh-removed-0123abcd"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("kept")
    shardkit.gc(url, grace=0)
    assert not trash.exists() and (foreign / "mine.txt").read_text() == "kept"


def _grow(out, window=1) -> None:
    """A dataset three appends grew, ``window`` retiring generations: segments, key hashes, kept manifests."""
    _write(out, ["a0", "a1", "a2"])
    for g in range(1, 4):
        _write(out, [f"g{g}-0", f"g{g}-1"], mode="append", window=window)


def _only_the_new_dataset(out) -> None:
    names = set(os.listdir(out))
    ours = names - {*USER_FILES, "pile-dir.tar", "train.py"}
    assert ours == {layout.MANIFEST, *manifest.read(str(out)).files()}, sorted(ours)


def test_an_overwrite_of_a_grown_dataset_leaves_none_of_its_generations_for_gc_to_call_foreign(tmp_path):
    out = tmp_path / "ds"
    _grow(out)
    assert any(layout.GENERATION_FILE.fullmatch(n) for n in os.listdir(out))  # older generations are kept
    _plant_user_files(out)
    _write(out, ["b0", "b1"], overwrite=True)
    _user_files_intact(out)
    _only_the_new_dataset(out)
    report = shardkit.gc(str(out), grace=0, dry_run=True)
    assert report.deleted == [] and set(report.skipped) == {*USER_FILES, "pile-dir.tar"}  # the user's files, and only those
    # the new dataset grows past the old one's generations: its kept manifests are its own
    for g in range(1, 4):
        _write(out, [f"n{g}"], mode="append")
    assert Dataset(str(out)).pinned(0).samples == 2
    assert sorted(_keys(out)) == ["b0", "b1", "n1", "n2", "n3"]
    report = shardkit.gc(str(out), grace=0)  # only the new dataset's own kept manifests go
    assert report.deleted == [layout.generation_name(g) for g in range(3)] and set(report.skipped) == {*USER_FILES, "pile-dir.tar"}
    _user_files_intact(out)


def test_overwrite_and_gc_on_the_command_line_leave_only_the_new_dataset(tmp_path, capsys):
    from shardkit.cli import main

    out = tmp_path / "ds"
    _grow(out, window=2)
    _plant_user_files(out)
    src = tmp_path / "src"
    _write(src, ["c0", "c1", "c2"])
    assert main(["pile", str(src / "pile-*.tar"), "-o", str(out), "--piles", "2", "--overwrite", "-q"]) == 0
    capsys.readouterr()
    _only_the_new_dataset(out)
    assert main(["gc", str(out), "--grace", "0s", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "would delete 0 files" in said and "pile-00000" not in said and "shardkit.g00000" not in said, said
    assert main(["gc", str(out), "--grace", "0s"]) == 0
    said = capsys.readouterr().out
    assert "deleted 0 files" in said and "pile-00000" not in said and "shardkit.g00000" not in said, said
    _user_files_intact(out)
    _only_the_new_dataset(out)


def test_an_overwrite_on_s3_removes_every_generation_of_the_old_dataset(s3):
    url = s3.url("ds")
    _write(url, ["a0", "a1", "a2"])
    for g in range(1, 4):
        _write(url, [f"g{g}-0", f"g{g}-1"], mode="append", window=1)
    s3.client().pipe_file(s3.path("ds/pile-notes.tar"), b"the user's")
    _write(url, ["b0", "b1"], overwrite=True)
    assert s3.names("ds") == {layout.MANIFEST, "pile-notes.tar", *manifest.read(url).files()}
    report = shardkit.gc(url, grace=0)
    assert report.deleted == [] and report.skipped == ["pile-notes.tar"]
    assert s3.client().cat_file(s3.path("ds/pile-notes.tar")) == b"the user's"


class _Killed(BaseException):
    """Stands for a kill: nothing of the job runs after it."""


def test_an_overwrite_killed_after_its_manifest_went_in_is_finished_by_the_next_job(tmp_path, monkeypatch):
    from shardkit.dataset import install

    out = tmp_path / "ds"
    _grow(out)
    _plant_user_files(out)
    real = install.delete_owned

    def killed(directory, names, *, reason, **kw):
        if reason == "replaced by the new dataset":
            raise _Killed
        return real(directory, names, reason=reason, **kw)

    monkeypatch.setattr(install, "delete_owned", killed)
    with pytest.raises(_Killed):
        _write(out, ["b0", "b1"], overwrite=True)
    monkeypatch.undo()
    assert manifest.read(str(out)).samples == 2 and any(layout.GENERATION_FILE.fullmatch(n) for n in os.listdir(out))
    report = shardkit.gc(str(out), grace=0)  # its claim finishes the install the journal describes
    _user_files_intact(out)
    _only_the_new_dataset(out)
    assert set(report.skipped) == {*USER_FILES, "pile-dir.tar"}


def test_an_overwrite_killed_before_its_manifest_went_in_leaves_every_old_generation(tmp_path, monkeypatch):
    from shardkit.dataset.lock import Output

    out = tmp_path / "ds"
    _grow(out)
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}

    def killed(self, result):
        raise _Killed

    monkeypatch.setattr(Output, "commit", killed)
    with pytest.raises(_Killed):
        _write(out, ["b0", "b1"], overwrite=True)
    monkeypatch.undo()
    assert any(layout.JOURNAL_FILE.fullmatch(n) for n in os.listdir(out))
    shardkit.gc(str(out), grace="1h")  # its claim undoes the install: the old dataset stays, with the generations it keeps
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before
    assert Dataset(str(out)).pinned(2).generation == 2


def _keys(out) -> list[str]:
    with shardkit.loader(str(out), decode=False) as loader:
        return [s["__key__"] for s in loader]


def test_an_append_replaces_a_kept_manifest_an_older_overwrite_left_of_another_dataset(tmp_path, caplog):
    """Overwrites made before they removed every generation left the old dataset's kept manifests:
    the first append of the new dataset must keep its own generation 0, not the stale copy (under
    the lock; in an object store a copy there may be a racing dataset's, and is kept)."""
    url, other = str(tmp_path / "ds"), str(tmp_path / "other")
    _write(other, ["x0", "x1", "x2"])
    stale = storage.read_bytes(storage.join(other, layout.MANIFEST))
    _write(url, ["b0", "b1"])
    storage.write_bytes(storage.join(url, layout.generation_name(0)), stale)  # as an older overwrite left it
    with caplog.at_level("WARNING", logger="shardkit.dataset.transaction"):
        _write(url, ["n1"], mode="append")
    assert "replacing a copy of generation 0 that is another dataset's manifest" in caplog.text
    assert Dataset(url).pinned(0).samples == 2
    assert sorted(_keys(url)) == ["b0", "b1", "n1"]
    _write(url, ["n2"], mode="append")  # an unchanged copy is left as it is
    assert Dataset(url).pinned(0).samples == 2 and Dataset(url).pinned(1).samples == 3


def test_a_journal_whose_file_could_not_be_removed_yet_is_kept_for_the_next_job(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    _write(out, ["a0", "a1"])
    stray = out / "pile-000000.v1.tar"  # an overwrite's new pile, moved in before the job died
    stray.write_bytes(b"x" * 1024)
    journal = out / layout.journal_name("0" * 32)
    journal.write_text(json.dumps({"files": [stray.name], "delete": []}))
    real_unlink = os.unlink

    def busy(path, *args, **kwargs):
        if str(path).endswith(stray.name):
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", busy)
    shardkit.gc(str(out), grace=0)
    assert stray.exists() and journal.exists(), "the journal is the only record that the stray file is shardkit's"
    monkeypatch.setattr(os, "unlink", real_unlink)
    report = shardkit.gc(str(out), grace=0)
    assert not stray.exists() and not journal.exists()
    assert stray.name in report.deleted


def test_on_s3_an_append_that_loses_to_an_overwrite_keeps_the_new_datasets_kept_manifest(s3, monkeypatch):
    from shardkit.dataset.transaction import Transaction

    url = s3.url("ds")
    original = Transaction._keep_base
    state: dict = {}

    def keep_base(self, output):
        if state.get("armed") and "raced" not in state:  # the slow append reaches its keep only now
            state["raced"] = True
            _write(url, ["n0", "n1"], overwrite=True)  # the dataset is replaced...
            state["new"] = storage.read_bytes(storage.join(url, layout.MANIFEST))
            _write(url, ["m0"], mode="append")  # ...and grows: its own generation 0 is kept
        return original(self, output)

    monkeypatch.setattr(Transaction, "_keep_base", keep_base)
    _write(url, ["a0", "a1"])
    slow = shardkit.PileWriter(url, piles=2, mode="append")
    slow.write({"__key__": "s0", "bin": b"s0"})
    state["armed"] = True
    with pytest.raises(shardkit.DatasetExistsError):
        slow.close()
    assert storage.read_bytes(storage.join(url, layout.generation_name(0))) == state["new"]
    assert Dataset(url).pinned(0).samples == 2


@pytest.mark.parametrize("index", [False, True], ids=["no-index", "index"])
def test_on_s3_an_overwrite_keeps_what_an_append_to_the_new_dataset_wrote_meanwhile(s3, monkeypatch, index):
    """Without a lock, an append to the new dataset may run between the overwrite's commit and its
    deletes of the old dataset's kept manifests and indexes, under the same names."""
    from shardkit.dataset.lock import Output

    url = s3.url("ds")
    _write(url, ["a0", "a1"], index=index)
    _write(url, ["a2"], mode="append", index=index)  # the old dataset keeps its generation 0
    original = Output.commit
    state: dict = {}

    def commit(self, result):
        done = original(self, result)
        if result.samples == 2 and "raced" not in state:  # the overwrite's manifest is in
            state["raced"] = True
            _write(url, ["m0"], mode="append", index=index)  # the new dataset grows: it keeps its generation 0
        return done

    monkeypatch.setattr(Output, "commit", commit)
    _write(url, ["n0", "n1"], overwrite=True, index=index)
    assert state and manifest.read(url).generation == 1
    assert sorted(_keys(url)) == ["m0", "n0", "n1"]
    assert Dataset(url).pinned(0).samples == 2  # its own, not deleted as the old dataset's
