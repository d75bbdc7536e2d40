"""DataLoader workers send where a local plain pile's fields lie; the main process cuts them from its own map."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import uuid

import numpy as np
import pytest

import shardkit
from shardkit import storage
from shardkit.errors import CorruptShardError
from shardkit.loading import located
from shardkit.loading import source as source_module
from shardkit.loading.located import Located, cut
from tests.conftest import make_samples

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'shardkit[torch]')")

from shardkit.loading.ring import Ring  # noqa: E402
from shardkit.torch import ShardkitDataLoader, ShardkitDataset  # noqa: E402

N = 150


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("located") / "ds")
    with shardkit.PileWriter(out, piles=4, seed=3) as w:
        for s in make_samples(N, size=300):
            w.write(s)
    return out


def plain(batches: list[dict]) -> list[dict]:
    return [{k: [bytes(x) for x in v] if k != "__key__" else v for k, v in b.items()} for b in batches]


def read(dl: ShardkitDataLoader, epochs: int = 1) -> list[dict]:
    got = []
    for epoch in range(epochs):
        dl.dataset.set_epoch(epoch)
        got += list(dl)
    return got


def by_values(monkeypatch, make):
    """What ``make()`` yields with no pile's fields left in place: the path before fields were located."""
    with monkeypatch.context() as m:
        m.setattr(located, "version", lambda pile: None)
        return make()


def ring_count(dl: ShardkitDataLoader) -> int:
    ring = dl._ring
    return 0 if ring is None else sum(ring.count(w) for w in range(ring.workers))


@pytest.mark.parametrize(("views", "mix"), [(False, 1), (True, 1), (False, 3), (True, 2)])
def test_the_batches_are_those_sent_as_values_in_the_same_order(data, monkeypatch, views, mix):
    """Piles read one after another, or mixed position by position (``mix``): a batch's fields
    then lie in several piles, each value in its place."""

    def make() -> ShardkitDataLoader:
        return ShardkitDataLoader(
            ShardkitDataset(data, batch_size=16, decode=False, seed=2, views=views, mix=mix), num_workers=2, persistent_workers=True
        )

    old = make()
    want = by_values(monkeypatch, lambda: read(old, epochs=2))
    dl = make()
    got = read(dl, epochs=2)
    assert plain(got) == plain(want)  # the same batches, in the same order
    kind = memoryview if views else bytes
    assert {type(v) for b in got for name in ("bin", "cls") for v in b[name]} == {kind}
    assert all(v.readonly for b in got for v in b["bin"]) if views else True
    if Ring.make(1) is not None:  # the old path went through the ring; now no batch does
        assert ring_count(old) == 2 * len(old) and ring_count(dl) == 0


def test_a_batch_across_two_piles_and_the_dataloader_s_ledger(data):
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2)
    dl = ShardkitDataLoader(ds, num_workers=2)
    ds.set_epoch(1)
    got = list(dl)
    with shardkit.loader(data, decode=False, seed=2) as one:
        counts = [p.samples for p in one.source.piles]
    assert N % 16 and all(c % 16 for c in counts)  # batches straddle piles
    for step, batch in enumerate(got[:-1]):  # (the ledger's last step of this split is checked in test_torch.py)
        assert dl.keys(step, epoch=1)[0] == batch["__key__"]
    keys = [k for b in got for k in b["__key__"]]
    assert len(set(keys)) == len(keys) == len(got) * 16


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_mid_epoch_gives_exactly_the_rest(data, persistent):
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2)
    dl = ShardkitDataLoader(ds, num_workers=2, persistent_workers=persistent)
    ds.set_epoch(1)
    want = plain(list(dl))
    it = iter(dl)
    head = plain([next(it) for _ in range(3)])
    state = json.loads(json.dumps(dl.state_dict()))
    del it
    again = ShardkitDataset(data, batch_size=16, decode=False, seed=2)
    resumed = ShardkitDataLoader(again, num_workers=2, persistent_workers=persistent)
    resumed.load_state_dict(state)
    again.set_epoch(1)
    assert head + plain(list(resumed)) == want


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("located") / "packed")
    with shardkit.PileWriter(out, piles=3, seed=3, compression="gzip") as w:
        for s in make_samples(60, size=200):
            w.write(s)
    return out


@pytest.mark.parametrize("compression", [None, "gzip"])  # fields left in the files; values through the ring
def test_a_killed_worker_is_an_error_and_the_next_iteration_is_whole(tmp_path, compression):
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=3, seed=3, compression=compression) as w:
        for s in make_samples(2000, size=200):  # 125 batches: the killed worker still has batches to give
            w.write(s)
    ds = ShardkitDataset(out, batch_size=16, decode=False, seed=2)
    want = plain(list(ShardkitDataLoader(ds, num_workers=2)))
    dl = ShardkitDataLoader(ds, num_workers=2, persistent_workers=True)
    it = iter(dl)
    next(it)
    # torch's SIGCHLD handler raises wherever the main thread happens to be (at the kill, or in
    # pytest after the test); without it torch's own poll raises in the loop, within 5 s
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        os.kill(dl._iterator._workers[0].pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            for _ in it:
                pass
    finally:
        dl._iterator._shutdown_workers()
        signal.signal(signal.SIGCHLD, previous)
    assert plain(list(ShardkitDataLoader(ds, num_workers=2))) == want


def test_compressed_piles_and_a_mix_of_shards_fall_back_to_values(data, packed, tmp_path, monkeypatch):
    dl = ShardkitDataLoader(ShardkitDataset(packed, batch_size=8, decode=False, seed=1), num_workers=2, persistent_workers=True)
    want = by_values(
        monkeypatch, lambda: plain(list(ShardkitDataLoader(ShardkitDataset(packed, batch_size=8, decode=False, seed=1), num_workers=2)))
    )
    assert plain(list(dl)) == want
    if Ring.make(1) is not None:
        assert ring_count(dl) == len(dl)  # every batch came as values
    # plain shards, one compressed: batches that straddle both carry located and copied values
    shutil.copy(os.path.join(packed, "pile-000000.tar.gz"), tmp_path / "b.tar.gz")
    shutil.copy(os.path.join(data, "pile-000001.tar"), tmp_path / "a.tar")
    shards = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar.gz")]

    def make() -> list[dict]:
        return plain(list(ShardkitDataLoader(ShardkitDataset(shards, batch_size=16, decode=False, seed=4), num_workers=1)))

    assert make() == by_values(monkeypatch, make)


def test_piles_in_an_object_store_fall_back_to_values(data, monkeypatch):
    fsspec = pytest.importorskip("fsspec", reason="remote URLs need the remote extra")
    root = f"memory://located-{uuid.uuid4().hex}"
    for name in sorted(os.listdir(data)):
        if os.path.isfile(os.path.join(data, name)):
            with open(os.path.join(data, name), "rb") as f:
                storage.write_bytes(storage.join(root, name), f.read())
    try:
        assert all(located.version(p) is None for p in shardkit.loader(root, decode=False).source.piles)

        def make() -> list[dict]:
            return plain(list(ShardkitDataLoader(ShardkitDataset(root, batch_size=16, decode=False, seed=2), num_workers=2)))

        assert make() == by_values(monkeypatch, make)
    finally:
        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_the_main_process_keeps_files_mapped_within_its_budgets(tmp_path, monkeypatch):
    """At least MAPS files, more while they total under MAPPED_BYTES, never over MAPS_MOST; the
    least recently used go first."""
    monkeypatch.setattr(located, "MAPS", 2)
    monkeypatch.setattr(located, "MAPPED_BYTES", 350)
    monkeypatch.setattr(located, "MAPS_MOST", 4)
    maps = located._Maps()
    urls = []
    for i in range(6):
        path = tmp_path / f"p{i}"
        path.write_bytes(bytes(100))
        urls.append(str(path))

    def held() -> list[str]:
        return list(maps._held)

    versions = {u: storage.locate(u)[0].version(storage.locate(u)[1]) for u in urls}
    for u in urls[:3]:
        maps.get(u, versions[u])
    assert held() == urls[:3]  # 300 bytes: under the budget
    maps.get(urls[3], versions[urls[3]])
    assert held() == urls[1:4]  # 400 bytes: the oldest goes, down to 300
    maps.get(urls[1], versions[urls[1]])  # used again: the newest now
    monkeypatch.setattr(located, "MAPPED_BYTES", 10**9)
    maps.get(urls[4], versions[urls[4]])
    maps.get(urls[5], versions[urls[5]])
    assert held() == [urls[3], urls[1], urls[4], urls[5]]  # MAPS_MOST bounds it whatever the bytes


def test_views_outlive_the_maps_the_main_process_lets_go(data, monkeypatch):
    monkeypatch.setattr(located, "MAPS", 1)
    monkeypatch.setattr(located, "MAPPED_BYTES", 0)
    ds = ShardkitDataset(data, batch_size=16, decode=False, seed=2, views=True)
    got = list(ShardkitDataLoader(ds, num_workers=2))
    want = plain(list(ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2)))
    assert plain(got) == want  # every view still reads its bytes after its pile's map was let go


def test_a_located_field_reads_as_its_values_and_travels_without_them(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(200)) * 10)
    url, (store, name) = str(path), storage.locate(str(path))
    version = store.version(name)
    buf = store.read_whole(name)
    a = Located([(url, version, buf, np.array([0, 10]), np.array([3, 10]))])
    b = Located([(url, version, buf, np.array([500]), np.array([505]))])
    field = Located.concat([a, b])
    assert len(field) == 3 and [bytes(v) for v in field] == [bytes([0, 1, 2]), b"", bytes(range(100, 105))]
    wire = field.wire()
    pieces, order = wire
    assert order is None and all(type(x) is bytes for piece in pieces for x in piece[2:]) and buf not in [x for p in pieces for x in p]
    assert cut(wire, views=False) == [bytes(v) for v in field]
    views = cut(wire, views=True)
    assert {type(v) for v in views} == {memoryview} and all(v.readonly for v in views) and [bytes(v) for v in views] == cut(wire, False)


def test_a_located_field_in_another_order_reads_and_travels_in_that_order(tmp_path):
    """Piles mixed position by position: one piece a pile, and the order the positions take them in."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(200)) * 10)
    url, (store, name) = str(path), storage.locate(str(path))
    version, buf = store.version(name), store.read_whole(name)
    a = Located([(url, version, buf, np.array([0, 10]), np.array([3, 12]))])  # values 0-2, 10-11
    b = Located([(url, version, buf, np.array([500]), np.array([505]))]).reordered(np.array([0]))  # 100-104
    mixed = Located.concat([a, b]).reordered(np.array([2, 0, 1]))
    want = [bytes(range(100, 105)), bytes([0, 1, 2]), bytes([10, 11])]
    assert [bytes(v) for v in mixed] == want and cut(mixed.wire(), views=False) == want
    twice = Located.concat([mixed, a])  # an ordered field joined with a plain one keeps both orders
    assert [bytes(v) for v in twice] == [*want, bytes([0, 1, 2]), bytes([10, 11])] == cut(twice.wire(), views=False)


def test_a_file_rewritten_in_place_is_refused_by_name(tmp_path):
    path = tmp_path / "pile-000000.tar"
    path.write_bytes(b"x" * 100)
    wire = ([(str(path), "100-1", np.array([0], dtype=np.int64).tobytes(), np.array([4], dtype=np.int64).tobytes())], None)
    with pytest.raises(CorruptShardError, match=r"pile-000000\.tar: the file changed while the DataLoader read it: version 100-1"):
        cut(wire, views=False)


def test_a_new_link_or_mode_is_no_change_to_a_running_dataloader(data, tmp_path):
    """Only written bytes change a pile's version: a backup by hard links (``cp -al``), new
    permissions, or shardkit's own install dropping a staged link, leave a DataLoader reading."""
    copy = str(tmp_path / "ds")
    shutil.copytree(data, copy)
    backup = tmp_path / "backup"
    backup.mkdir()
    ds = ShardkitDataset(copy, batch_size=16, decode=False, seed=2)
    want = plain(list(ShardkitDataLoader(ShardkitDataset(data, batch_size=16, decode=False, seed=2), num_workers=2)))
    got, it = [], iter(ShardkitDataLoader(ds, num_workers=2))
    got.append(next(it))
    for name in os.listdir(copy):
        os.link(os.path.join(copy, name), backup / name)
        os.chmod(os.path.join(copy, name), 0o444)
    got.extend(it)
    assert plain(got) == want


def test_a_pile_replaced_after_it_was_read_is_refused_not_cut_from_the_new_file(data, tmp_path, monkeypatch):
    """The version a located field names is that of the bytes read: a pile replaced between its read
    (ahead, in the background) and its first batch is refused where the main process cuts it."""
    copy = str(tmp_path / "ds")
    shutil.copytree(data, copy)
    real = source_module.fetch

    def fetch_then_replace(url, **keywords):
        fetched = real(url, **keywords)
        with open(url, "rb") as f:
            other = (np.frombuffer(f.read(), dtype=np.uint8) ^ 0xFF).tobytes()  # the same size, other bytes
        with open(url + ".new", "wb") as f:
            f.write(other)
        os.replace(url + ".new", url)
        return fetched

    monkeypatch.setattr(source_module, "fetch", fetch_then_replace)
    with shardkit.loader(copy, batch_size=16, decode=False, seed=2).locate_fields() as loader:
        field = next(iter(loader))["bin"]
    assert type(field) is Located
    with pytest.raises(CorruptShardError, match=r"pile-00000\d\.tar: the file changed while the DataLoader read it"):
        cut(field.wire(), views=False)


def test_a_pile_gone_with_an_overwrite_after_a_worker_read_it_says_why(data, tmp_path, monkeypatch):
    """The main process cuts a batch's fields from the pile file a worker read: when an overwrite
    of the dataset removed it in between, the error says so, as the loader's own does."""
    copy = str(tmp_path / "ds")
    shutil.copytree(data, copy)
    real = source_module.fetch

    def fetch_then_overwrite(url, **keywords):  # in the worker (forked with this patch)
        fetched = real(url, **keywords)
        if not os.path.exists(copy + ".overwritten"):
            open(copy + ".overwritten", "w").close()
            with shardkit.PileWriter(copy, piles=3, seed=9, overwrite=True) as w:
                for i in range(30):
                    w.write({"__key__": f"new{i:03d}", "bin": b"n" * 10})
        return fetched

    monkeypatch.setattr(source_module, "fetch", fetch_then_overwrite)
    dl = ShardkitDataLoader(ShardkitDataset(copy, batch_size=16, decode=False, seed=2), num_workers=1)
    with pytest.raises(shardkit.DatasetNotFoundError) as e:
        list(dl)
    assert re.fullmatch(
        rf"{re.escape(copy)}/pile-00000\d\.tar: no such file, removed after a DataLoader worker read it: "
        rf"the dataset at {re.escape(copy)} was overwritten since this loader opened it; a new loader reads it",
        str(e.value),
    ), str(e.value)


def test_the_error_for_a_vanished_pile_travels_whole():
    """It may be sent back from a training process (Ray, a launcher): it pickles with its URL."""
    import pickle

    error = located.Vanished("p.tar: no such file, removed after a DataLoader worker read it", "p.tar")
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), str(back), back.url) == (located.Vanished, str(error), "p.tar")
