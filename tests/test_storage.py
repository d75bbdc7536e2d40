"""The storage layer: brace and glob expansion, missing-file errors, atomic writes."""

from __future__ import annotations

import os

import pytest

import shardkit
from shardkit import storage
from shardkit.errors import ConfigError, DatasetNotFoundError, StorageError


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("plain.tar", ["plain.tar"]),
        ("s-{0..3}.tar", ["s-0.tar", "s-1.tar", "s-2.tar", "s-3.tar"]),
        ("s-{000..002}.tar", ["s-000.tar", "s-001.tar", "s-002.tar"]),
        ("s-{08..11}.tar", ["s-08.tar", "s-09.tar", "s-10.tar", "s-11.tar"]),
        ("s-{000098..000101}", ["s-000098", "s-000099", "s-000100", "s-000101"]),
        ("{a,b}.tar", ["a.tar", "b.tar"]),
        ("{train,val}-{0..1}.tar", ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]),
        ("s-{2..0}", ["s-2", "s-1", "s-0"]),
        ("{x}", ["{x}"]),
        ("{x}-{a,b}", ["{x}-a", "{x}-b"]),
    ],
)
def test_brace_expand(pattern, expected):
    assert storage.brace_expand(pattern) == expected


@pytest.fixture
def tree(tmp_path):
    for name in ["a-000.tar", "a-001.tar", "a-002.tar", "b.tar", "notes.txt"]:
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def test_expand_globs_braces_and_lists(tree):
    t = str(tree)
    assert storage.expand(f"{t}/a-*.tar") == [f"{t}/a-000.tar", f"{t}/a-001.tar", f"{t}/a-002.tar"]
    assert storage.expand(f"{t}/a-{{000..001}}.tar") == [f"{t}/a-000.tar", f"{t}/a-001.tar"]
    assert storage.expand([f"{t}/b.tar", f"{t}/a-00[2].tar"]) == [f"{t}/b.tar", f"{t}/a-002.tar"]
    assert storage.expand(f"file://{t}/b.tar") == [f"file://{t}/b.tar"]


def test_expand_once_refuses_a_file_named_twice_under_any_name(tree):
    t = str(tree)
    os.symlink(f"{t}/b.tar", f"{t}/link.tar")
    os.link(f"{t}/b.tar", f"{t}/hard.tar")
    os.mkdir(f"{t}/sub")
    for twice in (
        [f"{t}/a-*.tar", f"{t}/a-001.tar"],
        [f"{t}/b.tar", f"{t}/sub/../b.tar"],
        [f"{t}/{{b,b}}.tar"],
        [f"{t}/b.tar", f"file://{t}/b.tar"],
        [f"{t}/b.tar", f"{t}/link.tar"],
        [f"{t}/hard.tar", f"{t}/b.tar"],
    ):
        storage.expand(twice)  # allowed where naming a file twice is harmless
        with pytest.raises(ConfigError, match=r"\.tar is named twice \(by '.*' and by '.*'\): each input is read once; name it once"):
            storage.expand(twice, once=True)
    (tree / "sub" / "b.tar").write_bytes(b"another file of the same name")
    assert len(storage.expand([f"{t}/b.tar", f"{t}/sub/b.tar"], once=True)) == 2
    from shardkit.storage.patterns import _same_file

    assert _same_file("s3a://bucket/d/x.tar") == _same_file("s3://bucket/d/x.tar") != _same_file("s3://bucket/d/y.tar")


def test_expand_names_what_is_missing(tree):
    with pytest.raises(DatasetNotFoundError, match=r"a-003.tar: no such file"):
        storage.expand(f"{tree}/a-{{000..003}}.tar")
    with pytest.raises(DatasetNotFoundError, match=r"c-\*.tar: pattern matches no file"):
        storage.expand(f"{tree}/c-*.tar")
    with pytest.raises(DatasetNotFoundError, match=rf"{tree}: a directory, not a file: name the files in it \(e\.g\. {tree}/\*\)"):
        storage.expand(str(tree))  # a directory is not a shard


@pytest.mark.parametrize("command", ["pile", "shuffle"])
def test_pile_and_shuffle_point_a_dataset_directory_to_repile_not_to_its_files(tmp_path, command):
    # a grown dataset's files hold generations its window retired and compressed segments a '*.tar' misses
    out = str(tmp_path / "ds")
    with shardkit.PileWriter(out, piles=1) as w:
        w.write({"__key__": "a", "txt": "a"})
    run = {"pile": lambda: shardkit.pile(out, str(tmp_path / "o"), piles=2), "shuffle": lambda: shardkit.shuffle(out, str(tmp_path / "o"))}
    with pytest.raises(DatasetNotFoundError, match=rf"{out}: a shardkit dataset, not a file: .*shardkit repile {out} -o OUT"):
        run[command]()
    assert not (tmp_path / "o").exists()


def test_read_size_and_missing_files(tree):
    assert storage.read_bytes(str(tree / "b.tar")) == b"b.tar"
    assert storage.size(str(tree / "b.tar")) == 5
    assert storage.exists(str(tree / "b.tar")) and not storage.exists(str(tree / "zz"))
    for fn in (storage.read_bytes, storage.size):
        with pytest.raises(DatasetNotFoundError, match=r"zz: no such file"):
            fn(str(tree / "zz"))
    with pytest.raises(DatasetNotFoundError), storage.open_read(str(tree / "zz")):
        pass
    storage.remove(str(tree / "zz"))  # removing what is not there is fine


def test_atomic_write_publishes_whole_files_only(tmp_path):
    target = str(tmp_path / "f.bin")
    storage.write_bytes(target, b"old")
    with pytest.raises(RuntimeError), storage.atomic_write(target) as f:
        f.write(b"new but unfinished")
        raise RuntimeError("crash")
    assert os.listdir(tmp_path) == ["f.bin"]  # no partial file left behind
    assert storage.read_bytes(target) == b"old"
    storage.write_bytes(target, b"new")
    assert storage.read_bytes(target) == b"new" and os.listdir(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("how", ["atomic_write", "upload"])
def test_a_write_under_a_file_says_the_file_is_in_the_way(tmp_path, how):
    """The partial file cannot be made there either: cleaning it up must not hide why with its own ENOTDIR."""
    (tmp_path / "afile").write_bytes(b"x")
    (tmp_path / "src").write_bytes(b"data")
    target = str(tmp_path / "afile" / "out.parquet")
    with pytest.raises(StorageError) as error:
        if how == "upload":
            storage.upload(str(tmp_path / "src"), target)
        else:
            with storage.atomic_write(target) as f:
                f.write(b"data")
    assert str(error.value) == f"{target}: cannot write: {tmp_path / 'afile'} is a file, not a directory"


def test_a_write_into_a_missing_folder_names_the_folder(tmp_path):
    target = str(tmp_path / "nodir" / "out.parquet")
    with pytest.raises(DatasetNotFoundError) as error, storage.atomic_write(target) as f:
        f.write(b"data")
    assert str(error.value) == f"{target}: cannot write: no such folder {tmp_path / 'nodir'}"  # not "no such file"
    assert os.listdir(tmp_path) == []


def test_local_paths_and_join():
    assert storage.local_path("file:///data/x") == "/data/x"
    assert storage.local_path("rel/x") == "rel/x"
    assert storage.local_path("s3://bucket/x") is None
    assert storage.join("s3://bucket/dir/", "x.tar") == "s3://bucket/dir/x.tar"
    assert storage.join("/data", "x.tar") == os.path.join("/data", "x.tar")


def _threads(name: str) -> list[object]:
    import threading

    return [t for t in threading.enumerate() if t.name == name]


def test_writeback_runs_one_syncfs_at_a_time_in_a_thread_and_close_joins_it(tmp_path, monkeypatch):
    import threading

    from shardkit.storage import local

    release, calls = threading.Event(), []

    def slow_syncfs(fd: int) -> int:
        calls.append(os.fstat(fd).st_ino)
        release.wait(10)
        return 0

    monkeypatch.setattr(local, "_syncfs", lambda: slow_syncfs)
    writeback = storage.Writeback(str(tmp_path))
    writeback.start()
    writeback.start()  # the first still runs: nothing more starts
    assert len(_threads("shardkit-writeback")) == 1
    release.set()
    writeback.close()
    writeback.close()
    assert calls == [os.stat(tmp_path).st_ino] and not _threads("shardkit-writeback")
    writeback.start()  # the next flush's writeback starts once the last one ended
    writeback.close()
    assert len(calls) == 2


@pytest.mark.skipif(storage.local._syncfs() is None, reason="syncfs is a Linux call: Writeback does nothing elsewhere")
def test_writeback_of_a_real_file_system_and_of_a_missing_folder_raises_nothing(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    writeback = storage.Writeback(str(tmp_path))
    writeback.start()
    writeback.close()
    gone = storage.Writeback(str(tmp_path / "missing"))  # the sync before publishing names such a fault
    gone.start()
    gone.close()
    assert not _threads("shardkit-writeback")


def test_writeback_calls_go_through_one_descriptor_and_finish_reports_an_error_of_its_last_call(tmp_path, monkeypatch):
    """syncfs reports an error once per descriptor opened before it: every call shares one, and
    finish() makes the last, so an error between writebacks is reported too."""
    import ctypes
    import errno
    import threading

    from shardkit.errors import StorageError
    from shardkit.storage import local

    fds: list[int] = []

    def syncfs(fd: int) -> int:
        fds.append(fd)
        if threading.current_thread() is threading.main_thread():  # the last call, made by finish()
            ctypes.set_errno(errno.EIO)
            return -1
        return 0

    monkeypatch.setattr(local, "_syncfs", lambda: syncfs)
    writeback = storage.Writeback(str(tmp_path))
    for _ in range(3):
        writeback.start()
        writeback._join()
    with pytest.raises(StorageError, match=rf"{tmp_path}: .*flush to disk"):
        writeback.finish()
    writeback.close()
    assert len(fds) == 4 and len(set(fds)) == 1
    writeback.close()  # idempotent


def test_fsync_queue_flushes_each_file_in_a_thread_in_order_and_finish_waits(tmp_path, monkeypatch):
    import threading

    from shardkit.storage import local

    flushed, threads, real = [], set(), local.fsync_file

    def recording(path: str) -> None:
        threads.add(threading.current_thread().name)
        real(path)
        flushed.append(os.path.basename(path))

    monkeypatch.setattr(local, "fsync_file", recording)
    queue = storage.FsyncQueue()
    queue.finish()  # nothing added: nothing to wait for
    names = [f"shard-{i:06d}.tar" for i in range(5)]
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 10_000)
        queue.add(str(tmp_path / name))
    queue.finish()
    assert flushed == names and threads == {"shardkit-fsync"} and not _threads("shardkit-fsync")
    queue.close()  # idempotent, after finish too
    queue.add(str(tmp_path / names[0]))  # a new thread takes the next ones
    queue.close()
    assert flushed == [*names, names[0]]


def test_fsync_queue_raises_the_first_failure_naming_its_file_and_flushes_nothing_after_it(tmp_path, monkeypatch):
    from shardkit.errors import ShardkitError
    from shardkit.storage import local

    flushed, real = [], local.fsync_file
    monkeypatch.setattr(local, "fsync_file", lambda path: real(path) or flushed.append(os.path.basename(path)))
    (tmp_path / "a.tar").write_bytes(b"a")
    (tmp_path / "c.tar").write_bytes(b"c")
    queue = storage.FsyncQueue()
    for name in ("a.tar", "b.tar", "c.tar"):  # b.tar was never made
        queue.add(str(tmp_path / name))
    with pytest.raises(ShardkitError, match=r"b\.tar: no such file"):
        queue.finish()
    assert flushed == ["a.tar"] and not _threads("shardkit-fsync")
    queue.finish()  # the error was raised once
    queue.add(str(tmp_path / "b.tar"))
    import time

    for _ in range(200):  # the thread meets the missing file; the next add() says so at once
        if queue._error is not None:
            break
        time.sleep(0.01)
    with pytest.raises(ShardkitError, match=r"b\.tar: no such file"):
        queue.add(str(tmp_path / "c.tar"))
    assert flushed == ["a.tar"]
    queue.close()


def test_sync_files_flushes_nothing_inside_throwaway_writes_on_that_thread_only(tmp_path, monkeypatch):
    import threading

    from shardkit.storage import local

    calls: list[int] = []
    monkeypatch.setattr(local, "_syncfs", lambda: lambda fd: calls.append(fd) or 0)
    path = tmp_path / "pile-000000.tar"
    path.write_bytes(b"x" * 1000)
    with storage.throwaway_writes():
        storage.sync_files([str(path)])
        assert calls == []
        other = threading.Thread(target=storage.sync_files, args=([str(path)],))  # another thread's writes are not its
        other.start()
        other.join()
        assert len(calls) == 1
    storage.sync_files([str(path)])
    assert len(calls) == 2
    with pytest.raises(RuntimeError), storage.throwaway_writes():
        raise RuntimeError("a failing job")
    storage.sync_files([str(path)])  # left as it was, whatever ended the block
    assert len(calls) == 3
