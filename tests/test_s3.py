"""Datasets on a real S3 server (moto on loopback, the real s3fs client over HTTP): written, read,
cached, checked, and under the faults a proxy injects.

The fixtures (``s3``, ``faulty_s3``) live in conftest.py and tests/s3_server.py.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from conftest import make_samples

import shardkit
from shardkit import storage
from shardkit.errors import CorruptShardError, DatasetNotFoundError, ShardkitError, StorageError
from shardkit.storage import remote

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SAMPLES = make_samples(600, size=3000)
UNITS = [SAMPLES[i : i + 50] for i in range(0, len(SAMPLES), 50)]


def _identity(unit):
    return unit


def _objects(s3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``, read straight from moto: name -> bytes."""
    fs = s3.client()
    fs.invalidate_cache()  # its listings would not show what the code under test did since
    return {path.rsplit("/", 1)[1]: fs.cat_file(path) for path in sorted(fs.find(s3.path(prefix)))}


def _local_files(directory: str) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory)) if not name.startswith(".")}


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("local") / "ds")
    shardkit.preprocess(UNITS, _identity, out, piles=6, seed=3, quiet=True)
    return out


# --- writing ------------------------------------------------------------------------------------


def test_pass1_to_s3_gives_the_local_bytes_for_any_number_of_workers(s3, local_dataset):
    for workers in (1, 3):
        m = shardkit.preprocess(UNITS, _identity, s3.url(f"w{workers}"), piles=6, seed=3, workers=workers, quiet=True)
        assert m.samples == len(SAMPLES)
    one, three = _objects(s3, "w1"), _objects(s3, "w3")
    assert one == three == _local_files(local_dataset)
    # objects: one per pile and the manifest; no part or staging object ever reaches the bucket
    assert len(one) == 6 + 1


def test_every_writer_takes_an_s3_url(s3, local_dataset, tmp_path):
    with shardkit.PileWriter(s3.url("writer"), piles=6, seed=3) as w:
        for sample in SAMPLES:
            w.write(sample)
    assert shardkit.info(s3.url("writer")).samples == len(SAMPLES)
    shards = [os.path.join(local_dataset, p.name) for p in shardkit.manifest.read(local_dataset).piles]
    shardkit.pile(shards, s3.url("piled"), piles=4, quiet=True)
    # pile reads remote shards too, and shuffle and repile read and write S3
    shardkit.pile(
        [storage.join(s3.url("piled"), p.name) for p in shardkit.manifest.read(s3.url("piled")).piles], s3.url("again"), piles=3, quiet=True
    )
    shardkit.repile(s3.url("piled"), s3.url("repiled"), quiet=True)
    shardkit.shuffle(s3.url("piled") + "/pile-*.tar", s3.url("shuffled"), maxcount=100, quiet=True)
    for name in ("piled", "again", "repiled", "shuffled"):
        keys = sorted(s["__key__"] for s in shardkit.loader(s3.url(name), decode=False))
        assert keys == sorted(s["__key__"] for s in SAMPLES), name
        assert shardkit.verify(s3.url(name), quiet=True) == []
    job = tmp_path / "job.yaml"
    job.write_text(f"job: pile\ninputs: {json.dumps(shards)}\noutput: {{path: {s3.url('yaml')}, piles: 5}}\n")
    from shardkit.cli.main import main

    assert main(["run", str(job), "-q"]) == 0
    assert shardkit.info(s3.url("yaml")).piles == 5


def test_an_overwrite_on_s3_leaves_the_old_dataset_or_the_new_one(s3):
    shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=4, seed=1, quiet=True)
    with pytest.raises(shardkit.DatasetExistsError, match="already holds a shardkit dataset"):
        shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=4, seed=2, quiet=True)
    m = shardkit.preprocess(UNITS[:3], _identity, s3.url("ds"), piles=2, seed=2, overwrite=True, quiet=True)
    names = s3.names("ds")
    assert names == {p.name for p in m.piles} | {"shardkit.json"}  # the old piles are gone
    assert shardkit.verify(s3.url("ds"), quiet=True) == []


def test_a_failing_job_leaves_no_manifest_and_no_object_on_s3(s3):
    def bad(unit):
        if unit[0]["__key__"] == UNITS[5][0]["__key__"]:
            raise ValueError("broken unit")
        return unit

    with pytest.raises(shardkit.InputError, match="broken unit"):
        shardkit.preprocess(UNITS, bad, s3.url("ds"), piles=4, quiet=True)
    assert _objects(s3, "ds") == {}


def test_an_upload_that_keeps_failing_fails_the_job_cleanly(s3, faulty_s3, monkeypatch):
    monkeypatch.setattr(storage.retry, "DEFAULT", storage.retry.Retry(attempts=2, base=0.01, cap=0.02))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    faulty_s3.only = {"PUT", "POST"}
    faulty_s3.error_fraction = 1.0
    with pytest.raises(StorageError, match=r"s3://.*: cannot (write|upload)"):
        shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=4, quiet=True)
    faulty_s3.error_fraction = 0.0
    assert "shardkit.json" not in _objects(s3, "ds")
    # the next job clears what this one left and writes the whole dataset
    m = shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=4, quiet=True)
    assert s3.names("ds") == {p.name for p in m.piles} | {"shardkit.json"}


# --- reading ------------------------------------------------------------------------------------


def _epoch(url: str, **kwargs) -> list[dict]:
    return list(shardkit.loader(url, decode=False, **kwargs))


def _upload_dataset(s3, local: str, prefix: str) -> str:
    fs = s3.client()
    for name, data in _local_files(local).items():
        fs.pipe_file(s3.path(f"{prefix}/{name}"), data)
    return s3.url(prefix)


@pytest.mark.parametrize("kwargs", [{"seed": 5}, {"seed": 5, "batch_size": 32}, {"shuffle": False}, {"seed": 1, "mix": 2}])
def test_an_epoch_over_s3_is_the_local_epoch(s3, local_dataset, kwargs):
    url = _upload_dataset(s3, local_dataset, "ds")
    assert _epoch(url, **kwargs) == _epoch(local_dataset, **kwargs)
    assert _epoch(url, remote_concurrency=1, **kwargs) == _epoch(local_dataset, **kwargs)


def test_a_pile_is_read_in_concurrent_ranges(s3, faulty_s3, tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "MIN_RANGE", 1 << 20)  # ranges of 1 MiB: a 10 MB pile is worth splitting
    out = str(tmp_path / "big")
    shardkit.preprocess([make_samples(100, size=100_000)], _identity, out, piles=1, quiet=True)  # one 10 MB pile
    url = _upload_dataset(s3, out, "big")
    requests = []
    for concurrency in (1, 4):
        before = faulty_s3.counts()["requests"]
        assert len(_epoch(url, remote_concurrency=concurrency)) == 100
        requests.append(faulty_s3.counts()["requests"] - before)
    # the pile in 4 ranges instead of 1
    assert requests[1] - requests[0] == 3


def test_small_piles_are_read_several_at_once_in_one_request_each(s3, faulty_s3, local_dataset, monkeypatch):
    url = _upload_dataset(s3, local_dataset, "ds")
    faulty_s3.latency = 0.05  # every request waits: reads that overlap do so for certain
    lock, busy, peak, pieces = threading.Lock(), [0], [0], []
    read_ranges = remote.read_ranges

    def watched(url: str, *, size: int, concurrency: int) -> bytes:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
            pieces.append(len(remote.ranges(size, concurrency)))
        try:
            return read_ranges(url, size=size, concurrency=concurrency)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(remote, "read_ranges", watched)
    peaks = {}
    for prefetch in (None, 1):
        peak[0] = 0
        pieces.clear()
        assert _epoch(url, seed=5, prefetch=prefetch) == _epoch(local_dataset, seed=5)
        assert not [t for t in threading.enumerate() if t.name.startswith("shardkit-reader")]  # every reader joined
        assert pieces == [1] * 6  # six piles of a few KB: one request each
        peaks[prefetch] = peak[0]
    assert peaks[1] == 1 and peaks[None] > 1


def test_reader_threads_share_one_filesystem(s3):
    url = s3.url("x")
    found = []
    threads = [threading.Thread(target=lambda: found.append(remote.filesystem(url)[0])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(fs) for fs in found}) == 1  # fsspec alone makes one per thread, each with its own client
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec forgets them: so does shardkit
    assert remote.filesystem(url)[0] is not found[0]


def test_resume_over_s3(s3, local_dataset):
    url = _upload_dataset(s3, local_dataset, "ds")
    first = shardkit.loader(url, decode=False, batch_size=16, seed=2)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    second = shardkit.loader(url, decode=False, batch_size=16, seed=2)
    second.load_state_dict(state)
    rest = list(second)
    assert head + rest == list(shardkit.loader(local_dataset, decode=False, batch_size=16, seed=2))


def test_verify_finds_a_flipped_byte_in_s3(s3, local_dataset):
    url = _upload_dataset(s3, local_dataset, "ds")
    assert shardkit.verify(url, quiet=True) == []
    fs = s3.client()
    name = shardkit.manifest.read(local_dataset).piles[2].name
    data = bytearray(fs.cat_file(s3.path(f"ds/{name}")))
    data[700] ^= 0x20
    fs.pipe_file(s3.path(f"ds/{name}"), bytes(data))
    problems = shardkit.verify(url, quiet=True)
    assert [(p.name, p.kind) for p in problems][:1] == [(name, "checksum")]
    with pytest.raises(CorruptShardError, match=rf"s3://.*/{name}: checksum is .* the manifest says .* \(read 3 times\)"):
        _epoch(url)


def test_missing_and_denied_piles_name_the_url_and_can_be_skipped(s3, local_dataset, caplog):
    url = _upload_dataset(s3, local_dataset, "ds")
    piles = shardkit.manifest.read(local_dataset).piles
    s3.client().rm_file(s3.path(f"ds/{piles[1].name}"))
    with pytest.raises(DatasetNotFoundError, match=rf"s3://.*/ds/{piles[1].name}: no such file"):
        _epoch(url)
    with caplog.at_level(logging.WARNING):
        got = _epoch(url, on_error="skip")
    assert len(got) == sum(p.samples for p in piles) - piles[1].samples
    # wrong credentials: the error names the URL and never the secret
    options = {"key": "nobody", "secret": "hunter2-very-secret", "client_kwargs": {"endpoint_url": s3.endpoint}}
    os.environ.pop("AWS_ACCESS_KEY_ID", None)
    with pytest.raises(ShardkitError) as info:
        _epoch(s3.url("ds"), storage_options=options)
    assert "hunter2" not in str(info.value) and s3.url("ds") in str(info.value)
    assert "hunter2" not in repr(shardkit.LoaderOptions(storage_options=options))
    assert "hunter2" not in caplog.text


def test_storage_options_reach_the_client(s3, local_dataset, monkeypatch):
    url = _upload_dataset(s3, local_dataset, "ds")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    options = {"endpoint_url": s3.endpoint}
    assert _epoch(url, seed=5, storage_options=options) == _epoch(local_dataset, seed=5)
    from shardkit.cli.main import main

    assert main(["--storage-option", f"endpoint_url={s3.endpoint}", "verify", url, "-q"]) == 0
    m = json.loads(s3.client().cat_file(s3.path("ds/shardkit.json")))
    assert s3.endpoint not in json.dumps(m)


def test_botocore_retries_given_in_config_kwargs_are_taken(s3, local_dataset):
    url = _upload_dataset(s3, local_dataset, "ds")
    options = {"config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}}}  # botocore's form, as docs/s3.md says
    assert _epoch(url, seed=5, storage_options=options) == _epoch(local_dataset, seed=5)
    m = shardkit.preprocess(UNITS[:2], _identity, s3.url("w"), piles=2, storage_options=options, quiet=True)
    assert m.samples == 100
    from shardkit.cli.main import main

    assert main(["--storage-option", "config_kwargs.retries.max_attempts=2", "verify", url, "-q"]) == 0


# --- the cache ----------------------------------------------------------------------------------


def test_the_second_epoch_comes_from_the_cache(s3, faulty_s3, local_dataset, tmp_path):
    url = _upload_dataset(s3, local_dataset, "ds")
    cache = str(tmp_path / "cache")
    loader = shardkit.loader(url, decode=False, seed=4, cache_dir=cache)
    first = list(loader)
    before = faulty_s3.counts()["requests"]
    second = list(loader)
    assert faulty_s3.counts()["requests"] == before  # no request at all
    local = shardkit.loader(local_dataset, decode=False, seed=4)
    assert first == list(local) and second == list(local)  # epochs 0 and 1
    # a copy damaged on disk is dropped and fetched again
    copy = next(os.path.join(cache, "shardkit-piles", n) for n in os.listdir(os.path.join(cache, "shardkit-piles")) if n.endswith(".tar"))
    os.chmod(copy, 0o644)
    with open(copy, "r+b") as f:
        f.seek(600)
        f.write(b"\xff")
    assert _epoch(url, seed=4, cache_dir=cache) == first


def test_a_cache_directory_removed_between_epochs_is_made_again(s3, local_dataset, tmp_path):
    url = _upload_dataset(s3, local_dataset, "ds")
    cache = tmp_path / "cache"
    loader = shardkit.loader(url, decode=False, seed=4, cache_dir=str(cache))
    local = shardkit.loader(local_dataset, decode=False, seed=4)
    assert list(loader) == list(local)
    shutil.rmtree(cache)  # a cleaner of temporary files, or a person freeing disk, while training runs
    assert list(loader) == list(local)  # epoch 1
    assert any(n.endswith(".tar") for n in os.listdir(cache / "shardkit-piles"))  # filled again


def test_a_cache_smaller_than_a_pile_reads_through_it(s3, local_dataset, tmp_path, caplog):
    url = _upload_dataset(s3, local_dataset, "ds")
    with caplog.at_level(logging.WARNING):
        got = _epoch(url, seed=4, cache_dir=str(tmp_path / "c"), cache_limit=1000)
    assert got == _epoch(local_dataset, seed=4)
    assert "larger than the whole cache (cache_limit=1000 B)" in caplog.text


def test_eviction_keeps_the_cache_under_its_limit(s3, local_dataset, tmp_path):
    url = _upload_dataset(s3, local_dataset, "ds")
    sizes = [p.bytes for p in shardkit.manifest.read(local_dataset).piles]
    limit = 2 * max(sizes) + 1
    cache = tmp_path / "c"
    for seed in range(3):
        assert _epoch(url, seed=seed, cache_dir=str(cache), cache_limit=limit) == _epoch(local_dataset, seed=seed)
        held = sum(f.stat().st_size for f in (cache / "shardkit-piles").glob("*.tar"))
        assert 0 < held <= limit


def _read_with_cache(url: str, cache: str, endpoint: str, queue) -> None:
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    keys = [s["__key__"] for s in shardkit.loader(url, decode=False, seed=1, cache_dir=cache)]
    queue.put(keys)


def test_two_processes_share_one_cache(s3, faulty_s3, local_dataset, tmp_path):
    url = _upload_dataset(s3, local_dataset, "ds")
    cache = str(tmp_path / "shared")
    before = faulty_s3.counts()["requests"]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_read_with_cache, args=(url, cache, faulty_s3.endpoint, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results[0] == results[1] == [s["__key__"] for s in _epoch(local_dataset, seed=1)]
    piles = len(shardkit.manifest.read(local_dataset).piles)
    gets = faulty_s3.counts()["requests"] - before
    # each process reads the manifest (in one request, or two where s3fs asks its size first); each
    # pile is downloaded once, by one of them (small piles: one range each)
    assert 2 * 1 + piles <= gets <= 2 * 2 + piles


# --- faults -------------------------------------------------------------------------------------


def test_an_epoch_through_resets_and_503s_is_exact(s3, faulty_s3, local_dataset):
    url = _upload_dataset(s3, local_dataset, "ds")
    faulty_s3.only = {"GET", "HEAD"}
    faulty_s3.reset_fraction = 0.2
    faulty_s3.error_fraction = 0.2
    for kwargs in ({"seed": 5}, {"seed": 2, "batch_size": 16}, {"shuffle": False}):
        assert _epoch(url, **kwargs) == _epoch(local_dataset, **kwargs)
    counts = faulty_s3.counts()
    assert counts["resets"] > 0 and counts["errors"] > 0


def test_pass1_through_faults_is_exact_or_fails_cleanly(s3, faulty_s3, local_dataset):
    faulty_s3.reset_fraction = 0.1
    faulty_s3.error_fraction = 0.1
    try:
        shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=6, seed=3, workers=2, quiet=True)
    except ShardkitError as e:
        assert "s3://" in str(e)
        assert "shardkit.json" not in _objects(s3, "ds")
    else:
        assert _objects(s3, "ds") == _local_files(local_dataset)
    assert faulty_s3.counts()["resets"] + faulty_s3.counts()["errors"] > 0


def test_an_overwrite_killed_mid_upload_leaves_the_old_dataset(s3, faulty_s3, tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where local staging goes
    old = shardkit.preprocess(UNITS[:4], _identity, s3.url("ds"), piles=3, quiet=True)
    assert os.listdir(temp) == []  # a job that ends removes its staging
    faulty_s3.latency = 0.2  # slow enough to be killed while uploading
    script = tmp_path / "job.py"
    script.write_text(
        "import shardkit, sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from conftest import make_samples\n"
        "s = make_samples(600, size=3000)\n"
        f"shardkit.preprocess([s[i:i+50] for i in range(0, 600, 50)], lambda u: u, {s3.url('ds')!r}, piles=12, overwrite=True, quiet=True)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(n.startswith("pile-") and ".v" in n for n in s3.names("ds")):
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    faulty_s3.latency = 0.0
    assert [n for n in os.listdir(temp) if n.startswith(".shardkit-pass1-")]  # the dead job's
    # the old dataset is whole; what the dead job uploaded is listed as left by it (its journal names it)
    assert shardkit.manifest.read(s3.url("ds")) == old
    assert len(_epoch(s3.url("ds"))) == old.samples
    problems = shardkit.verify(s3.url("ds"), quiet=True)
    assert problems and all(p.warning for p in problems)
    assert {p.kind for p in problems} == {"leftover"} and any(p.name.startswith("pile-") for p in problems)
    # the next job finds the dead one's journal and removes its objects before writing, and
    # removes its local staging (its lock is free)
    m = shardkit.preprocess(UNITS, _identity, s3.url("ds"), piles=4, overwrite=True, quiet=True)
    assert s3.names("ds") == {p.name for p in m.piles} | {"shardkit.json"}
    assert shardkit.verify(s3.url("ds"), quiet=True) == []
    assert os.listdir(temp) == []


def test_dataloader_workers_read_s3_through_one_cache(s3, faulty_s3, local_dataset, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")
    from shardkit.torch import ShardkitDataset

    url = _upload_dataset(s3, local_dataset, "ds")
    cache = str(tmp_path / "cache")
    keys = []
    for _ in range(2):  # the second pass reads every pile from the cache the workers filled
        ds = ShardkitDataset(url, batch_size=8, decode=False, drop_last=False, world_size=1, rank=0, cache_dir=cache)
        before = faulty_s3.counts()["requests"]
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        keys.append(sorted(k for batch in dl for k in batch["__key__"]))
    assert keys[0] == keys[1] == sorted(s["__key__"] for s in SAMPLES)
    piles = len(shardkit.manifest.read(local_dataset).piles)
    assert faulty_s3.counts()["requests"] - before <= 3 * 2  # the manifest only, once per process: no pile
    assert len(os.listdir(os.path.join(cache, "shardkit-piles"))) >= piles


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_worker_processes_read_remote_input_shards(s3, local_dataset, mp_context):
    url = _upload_dataset(s3, local_dataset, "src")
    shards = [storage.join(url, p.name) for p in shardkit.manifest.read(local_dataset).piles]
    m = shardkit.pile(shards, s3.url("out"), piles=3, workers=2, mp_context=mp_context, quiet=True)
    one = shardkit.pile(shards, s3.url("one"), piles=3, workers=1, quiet=True)
    assert m == one and _objects(s3, "out") == _objects(s3, "one")


def test_whole_object_reads_leave_the_checksum_to_the_manifest(s3, monkeypatch):
    import s3fs

    monkeypatch.delenv("AWS_RESPONSE_CHECKSUM_VALIDATION", raising=False)
    config = remote.filesystem(s3.url("x"))[0].s3.meta.config
    # botocore would CRC every body on the event loop thread; each pile is checked against its manifest instead
    assert config.response_checksum_validation == "when_required"
    assert config.retries["total_max_attempts"] == 1  # shardkit's retry layer is the one
    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_supported")  # a setting of the user's wins
    assert remote.filesystem(s3.url("x"))[0].s3.meta.config.response_checksum_validation == "when_supported"


def test_a_url_with_nothing_there_says_so_and_what_was_expected(s3):
    for url in (s3.url("missing"), s3.url("missing/")):
        with pytest.raises(DatasetNotFoundError, match=r"missing/?: no such file or directory \(expected a shardkit dataset"):
            shardkit.loader(url)
    other = s3.url("x").replace(s3.bucket, s3.bucket + "-never-made", 1)
    with pytest.raises(DatasetNotFoundError, match=r"the bucket .*-never-made does not exist"):
        shardkit.loader(other.rsplit("/", 1)[0] + "/ds")


def _store_with_cache(s3, tmp_path, prefix: str, data: bytes):
    import zlib

    from shardkit.storage import CachingStore, FsspecStore
    from shardkit.storage.cache import PileCache

    s3.client().pipe(s3.path(f"{prefix}/p.tar"), data)
    want = zlib.crc32(data)
    check = lambda buf: None if zlib.crc32(buf) == want else "checksum differs"  # noqa: E731
    return CachingStore(FsspecStore(s3.url(prefix), concurrency=8), PileCache(str(tmp_path / "cache"))), check


def test_a_cached_miss_of_a_pile_read_in_one_request_is_downloaded_into_its_cache_file(s3, tmp_path, monkeypatch):
    import mmap

    from shardkit.storage import FsspecStore

    data = os.urandom(3 << 20)
    store, check = _store_with_cache(s3, tmp_path, "one", data)
    streamed, real = [], FsspecStore.download
    monkeypatch.setattr(FsspecStore, "download", lambda self, *a, **k: streamed.append(real(self, *a, **k)) or streamed[-1])
    got = store.read_checked("p.tar", size=len(data), check=check)
    assert isinstance(got, mmap.mmap) and got[:] == data and streamed == [True]
    files = os.listdir(tmp_path / "cache" / "shardkit-piles")
    assert [n for n in files if n.endswith("-p.tar")] and not [n for n in files if ".partial-" in n]
    assert store.read_checked("p.tar", size=len(data), check=check)[:] == data and streamed == [True]  # a hit


def test_a_pile_read_in_ranges_is_not_streamed_but_still_cached(s3, tmp_path, monkeypatch):
    from shardkit.storage import FsspecStore

    monkeypatch.setattr(remote, "MIN_RANGE", 1 << 20)  # 3 MiB: three ranges at once
    data = os.urandom(3 << 20)
    store, check = _store_with_cache(s3, tmp_path, "ranges", data)
    streamed, real = [], FsspecStore.download
    monkeypatch.setattr(FsspecStore, "download", lambda self, *a, **k: streamed.append(real(self, *a, **k)) or streamed[-1])
    assert store.read_checked("p.tar", size=len(data), check=check)[:] == data
    assert streamed == [False] and [n for n in os.listdir(tmp_path / "cache" / "shardkit-piles") if n.endswith("-p.tar")]


def test_a_streamed_pile_is_downloaded_again_while_wrong_then_named_corrupt(s3, tmp_path, monkeypatch):
    from shardkit.storage import FsspecStore

    data = os.urandom(100_000)
    store, _ = _store_with_cache(s3, tmp_path, "bad", data)
    calls = []
    real = FsspecStore.download
    monkeypatch.setattr(FsspecStore, "download", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    with pytest.raises(CorruptShardError, match=r"bad/p\.tar: checksum differs \(read 3 times\)"):
        store.read_checked("p.tar", size=len(data), check=lambda buf: "checksum differs")
    assert len(calls) == 3
    assert not [n for n in os.listdir(tmp_path / "cache" / "shardkit-piles") if ".partial-" in n or n.endswith("-p.tar")]


def test_stores_whose_files_do_not_travel_never_stream(tmp_path):
    from shardkit.storage import LocalStore, MemoryStore

    (tmp_path / "p.tar").write_bytes(b"x" * 10)
    memory = MemoryStore()
    memory.put("p.tar", b"x" * 10)
    for store in (LocalStore(str(tmp_path)), memory):
        assert store.read_checked_into("p.tar", str(tmp_path / "copy"), size=10, check=lambda buf: None) is None
        assert not (tmp_path / "copy").exists()


def test_a_cache_disk_failing_under_the_stream_costs_that_try_not_the_read(s3, tmp_path, monkeypatch):
    import errno

    import s3fs.core

    data = os.urandom(100_000)
    store, check = _store_with_cache(s3, tmp_path, "eio", data)
    real, tries = open, []

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, chunk):
            raise OSError(errno.EIO, "Input/output error")

    def opening(path, mode="r", *args, **kwargs):
        f = real(path, mode, *args, **kwargs)
        if ".partial-" in str(path) and "w" in mode:
            tries.append(path)
            return Failing(f)
        return f

    monkeypatch.setattr(s3fs.core, "open", opening, raising=False)  # where s3fs writes what it downloads
    assert store.read_checked("p.tar", size=len(data), check=check)[:] == data
    assert len(tries) == 1  # one try at streaming, then the whole read (and the cache's own write)
    files = os.listdir(tmp_path / "cache" / "shardkit-piles")
    assert [n for n in files if n.endswith("-p.tar")] and not [n for n in files if ".partial-" in n]


def test_a_read_fault_of_a_faulty_store_fires_on_the_streamed_path_too(s3, tmp_path):
    from shardkit.storage import CachingStore, FaultyStore, FsspecStore
    from shardkit.storage.cache import PileCache

    data = os.urandom(100_000)
    s3.client().pipe(s3.path("fault/p.tar"), data)
    inner = FaultyStore(FsspecStore(s3.url("fault"), concurrency=8)).fail("read", nth=1)
    store = CachingStore(inner, PileCache(str(tmp_path / "cache")))
    assert store.read_checked("p.tar", size=len(data), check=lambda buf: None)[:] == data
    assert inner.calls["read"] == 2  # the streamed read failed as planted, and the whole read took over


def test_ctrl_c_during_a_streamed_download_leaves_no_file_behind(s3, faulty_s3, tmp_path):
    import _thread

    data = os.urandom(3 << 20)
    store, check = _store_with_cache(s3, tmp_path, "ctrlc", data)
    store.inner.size("p.tar")  # connected before the clock
    faulty_s3.latency = 1.0  # every answer comes a second late: the interrupt lands before the body
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        store.read_checked("p.tar", size=len(data), check=check)
    time.sleep(2.0)  # a download left running would have written its file by now
    left = [n for n in os.listdir(tmp_path / "cache" / "shardkit-piles") if n.endswith("-p.tar") or ".partial-" in n]
    assert left == []
