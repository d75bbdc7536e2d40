"""What users meet on S3 when things go wrong: a missing bucket, an object of another size than
its manifest says, a job killed at each step of its publish (moto on loopback, see s3_server.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile

import pytest
from conftest import make_samples

import shardkit
from shardkit import manifest
from shardkit.errors import CorruptShardError, DatasetNotFoundError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SAMPLES = make_samples(240, size=2000)
UNITS = [SAMPLES[i : i + 40] for i in range(0, len(SAMPLES), 40)]


def _identity(unit):
    return unit


def _keys(url: str) -> list[str]:
    return sorted(s["__key__"] for s in shardkit.loader(url, decode=False))


def test_a_missing_bucket_fails_the_job_before_any_work(s3):
    seen = []

    def fn(unit):
        seen.append(unit)
        return unit

    url = "s3://no-such-bucket-shardkit/ds"
    with pytest.raises(DatasetNotFoundError, match="the bucket s3://no-such-bucket-shardkit does not exist"):
        shardkit.preprocess(UNITS, fn, url, piles=3, quiet=True)
    assert seen == []  # a typo in the bucket costs no pass over the data
    with pytest.raises(DatasetNotFoundError, match="the bucket s3://no-such-bucket-shardkit does not exist"):
        _keys(url)


def test_an_object_longer_than_its_manifest_says_is_named_so(s3):
    url = s3.url("ds")
    m = shardkit.preprocess(UNITS, _identity, url, piles=3, quiet=True)
    pile = m.piles[0]
    fs = s3.client()
    fs.pipe_file(s3.path(f"ds/{pile.name}"), fs.cat_file(s3.path(f"ds/{pile.name}")) + bytes(4096))
    # the read asks for one byte past the manifest's size: it cannot say the real size, and does not pretend to
    with pytest.raises(
        CorruptShardError, match=rf"file is over {pile.bytes} bytes, the manifest says {pile.bytes} \(longer than written\)"
    ):
        _keys(url)


_JOB = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from conftest import make_samples
import shardkit
from shardkit import manifest, storage
from shardkit.dataset import lock as output

when = {when!r}
def die():
    os.kill(os.getpid(), signal.SIGKILL)
commit = output.Output.commit
def commit_manifest(self, m):
    if when == "before the manifest":
        die()
    commit(self, m)
    if when == "after the manifest":
        die()
    storage.remove = lambda url: die()  # while deleting the old piles: at the first
output.Output.commit = commit_manifest
s = make_samples(240, size=2000, seed=1)
shardkit.preprocess([s[i:i + 40] for i in range(0, 240, 40)], lambda u: u, {url!r}, piles=5, overwrite=True, quiet=True)
"""


@pytest.mark.parametrize("when", ["before the manifest", "after the manifest", "while deleting the old piles"])
def test_a_job_killed_while_publishing_leaves_one_whole_dataset(s3, tmp_path, monkeypatch, when):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    url = s3.url("ds")
    old = shardkit.preprocess(UNITS, _identity, url, piles=3, quiet=True)
    old_keys = _keys(url)
    script = tmp_path / "job.py"
    script.write_text(_JOB.format(tests=os.path.dirname(__file__), when=when, url=url))
    proc = subprocess.run([sys.executable, str(script)], env=dict(os.environ), capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    now = manifest.read(url)
    assert now == old if when == "before the manifest" else now != old
    assert len(_keys(url)) == len(old_keys)  # the same keys, old or new samples: whole either way
    problems = shardkit.verify(url, quiet=True)
    assert problems and all(p.warning for p in problems)  # the dead job's objects, listed beside it
    # the next job clears what the dead one left: its objects, its journal, its local staging
    m = shardkit.preprocess(UNITS, _identity, url, piles=4, overwrite=True, quiet=True)
    assert s3.names("ds") == {p.name for p in m.piles} | {manifest.MANIFEST}
    assert shardkit.verify(url, quiet=True) == []
    assert os.listdir(temp) == []


def test_an_append_whose_writes_fail_once_its_manifest_is_in_returns_what_it_published(s3, faulty_s3, monkeypatch, caplog):
    from shardkit import storage
    from shardkit.dataset import lock as output

    monkeypatch.setattr(storage.retry, "DEFAULT", storage.retry.Retry(attempts=2, base=0.01, cap=0.02))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    url = s3.url("ds")
    shardkit.preprocess(UNITS, _identity, url, piles=3, quiet=True)
    commit = output.Output.commit

    def commit_then_fail_every_write(self, m):
        commit(self, m)
        faulty_s3.only, faulty_s3.error_fraction = {"PUT", "POST", "DELETE"}, 1.0

    monkeypatch.setattr(output.Output, "commit", commit_then_fail_every_write)
    more = [[dict(s, __key__=f"b{s['__key__']}") for s in unit] for unit in UNITS]
    # the journal's removal and an append's first keys files come after the manifest: the job published
    m = shardkit.preprocess(more, _identity, url, piles=3, mode="append", quiet=True)
    faulty_s3.error_fraction = 0.0
    assert manifest.read(url) == m
    assert len(_keys(url)) == 2 * len(SAMPLES)
    assert "is published" in caplog.text
    problems = shardkit.verify(url, quiet=True)
    assert all(p.warning for p in problems)  # what it could not tidy, listed beside the dataset
    with pytest.raises(shardkit.SampleError):  # its keys are known without the keys files it could not put in
        shardkit.preprocess(more, _identity, url, piles=3, mode="append", quiet=True)


def test_of_two_jobs_on_a_prefix_the_store_lets_one_publish_and_the_other_deletes_nothing_of_it(s3):
    from shardkit.dataset.install import install
    from shardkit.dataset.lock import claim

    m = shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=2, quiet=True)
    first, second = claim(s3.url("ds"), overwrite=True), claim(s3.url("ds"), overwrite=True)
    assert first.conditional and second.conditional  # moto takes If-Match and If-None-Match
    staged = []
    for _ in (first, second):
        path = os.path.join(tempfile.mkdtemp(), "pile-000000.tar")
        with open(path, "wb") as f:
            f.write(s3.client().cat_file(s3.path(f"ds/{m.piles[0].name}")))
        staged.append(path)
    one = dataclasses.replace(m, piles=m.piles[:1])
    won = install(first, [staged[0]], one)
    with pytest.raises(shardkit.DatasetExistsError, match="another job published here while this one ran"):
        install(second, [staged[1]], one)  # its pile took another name: the first's is left alone
    assert manifest.read(s3.url("ds")) == won
    assert s3.names("ds") == {won.piles[0].name, manifest.MANIFEST}  # the loser's pile and journal are gone
    assert shardkit.verify(s3.url("ds"), quiet=True) == []


def test_a_misspelled_storage_option_is_a_config_error_naming_the_options(s3):
    with pytest.raises(shardkit.ConfigError, match=r"refused its options \['bogus_opt', 'secret'\]: TypeError") as info:
        shardkit.loader(s3.url("ds"), storage_options={"bogus_opt": 1, "secret": "s3cr3t-value"})
    assert "s3cr3t" not in str(info.value)


def test_old_piles_an_overwrite_could_not_look_up_are_left_to_the_next_job(s3, faulty_s3, monkeypatch):
    from shardkit import storage
    from shardkit.dataset import lock as output

    monkeypatch.setattr(storage.retry, "DEFAULT", storage.retry.Retry(attempts=2, base=0.01, cap=0.02))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    url = s3.url("ds")
    old = shardkit.preprocess(UNITS, _identity, url, piles=3, quiet=True)
    commit = output.Output.commit

    def commit_then_fail_every_lookup(self, m):
        commit(self, m)
        faulty_s3.only, faulty_s3.error_fraction = {"HEAD"}, 1.0

    monkeypatch.setattr(output.Output, "commit", commit_then_fail_every_lookup)
    new = shardkit.preprocess(UNITS, _identity, url, piles=4, overwrite=True, quiet=True)
    faulty_s3.error_fraction = 0.0
    assert {p.name for p in old.piles} <= s3.names("ds")  # throttled: they could not go yet
    # a failed look-up is not a missing object: the journal stays, and gc removes the old piles
    report = shardkit.gc(url, grace=0)
    assert {p.name for p in old.piles} <= set(report.deleted) and not report.skipped
    assert {p.name for p in new.piles} | {manifest.MANIFEST} <= s3.names("ds")


def test_an_overwrite_that_cannot_read_the_old_manifest_replaces_nothing(s3, faulty_s3, monkeypatch):
    """The old manifest unreadable for now (throttled past the deadline) is no answer: published
    anyway, the new dataset would leave every old pile named by no record, for good."""
    from shardkit import storage
    from shardkit.dataset import install

    monkeypatch.setattr(storage.retry, "DEFAULT", storage.retry.Retry(attempts=2, base=0.01, cap=0.02))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    url = s3.url("ds")
    old = shardkit.preprocess(UNITS, _identity, url, piles=3, quiet=True)
    replaced = install._replaced

    def throttled(out):
        faulty_s3.only, faulty_s3.error_fraction = {"GET"}, 1.0
        try:
            return replaced(out)
        finally:
            faulty_s3.error_fraction = 0.0

    monkeypatch.setattr(install, "_replaced", throttled)
    with pytest.raises(shardkit.StorageError, match="nothing was replaced: run the job again"):
        shardkit.preprocess(UNITS, _identity, url, piles=4, overwrite=True, quiet=True)
    assert manifest.read(url) == old and {p.name for p in old.piles} <= s3.names("ds")
    monkeypatch.setattr(install, "_replaced", replaced)
    new = shardkit.preprocess(UNITS, _identity, url, piles=4, overwrite=True, quiet=True)
    left = s3.names("ds")
    assert not {p.name for p in old.piles} & left and {p.name for p in new.piles} <= left
