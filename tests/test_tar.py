"""Tar members written by shardkit are read by every reader; the walker refuses bad archives."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile

import pytest
import reference_tar

from shardkit.errors import CorruptShardError
from shardkit.tar import walk as tarwalk
from shardkit.tar import write as tarwrite

NAMES = [
    "a.txt",
    "k/sub/b.cls",
    "d" * 120 + "/long.txt",  # over ustar's 100 bytes: needs a pax path record
    "données/é.txt",  # non-ASCII: pax too
    "empty.bin",
]


def _payload(name: str) -> bytes:
    return b"" if name == "empty.bin" else (name * 3).encode("utf-8", "surrogateescape")


def _archive(names: list[str] = NAMES) -> bytes:
    return b"".join(tarwrite.member(n, _payload(n)) for n in names) + tarwrite.TRAILER


@pytest.fixture
def archive(tmp_path) -> str:
    path = os.path.join(tmp_path, "a.tar")
    with open(path, "wb") as f:
        f.write(_archive())
    return path


def _walked(buf: bytes) -> dict[str, bytes]:
    m = tarwalk.walk(buf, "test.tar")
    return {n: buf[o : o + s] for n, o, s in zip(m.names, m.offsets, m.sizes, strict=True)}


def test_walk_reads_every_member_with_its_bytes():
    assert _walked(_archive()) == {n: _payload(n) for n in NAMES}


def test_python_tarfile_reads_every_member(archive):
    with tarfile.open(archive) as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        assert all(m.isfile() and m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in tf.getmembers())
    assert got == {n: _payload(n) for n in NAMES}


def test_gnu_tar_lists_every_member(archive):
    if shutil.which("tar") is None:
        pytest.skip("no tar binary on this machine")
    out = subprocess.run(["tar", "tf", archive], capture_output=True, check=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert out.stdout.decode("utf-8").splitlines() == NAMES


def test_a_name_that_is_not_utf8_is_written_back_as_its_bytes(tmp_path):
    # b"caf\xe9.bin" (Latin-1) reads in Python as 'caf\udce9.bin', as os.fsdecode and tarfile give it
    names = ["caf\udce9.bin", "x" * 99 + "\udcff.txt", "ok.txt"]
    buf = _archive(names)
    assert list(_walked(buf)) == names
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:  # so webdataset reads the same names
        assert [m.name for m in tf.getmembers()] == names
    path = tmp_path / "latin1.tar"
    path.write_bytes(buf)
    if shutil.which("tar") is not None:
        listed = ["tar", "tf", str(path), "--quoting-style=literal"]
        out = subprocess.run(listed, capture_output=True, check=True, env={**os.environ, "LC_ALL": "C"})
        assert out.stdout.splitlines() == [b"caf\xe9.bin", b"x" * 99 + b"\xff.txt", b"ok.txt"]


def test_members_are_512_byte_aligned_and_deterministic():
    assert len(_archive()) % 512 == 0
    assert _archive() == _archive()


def _corrupt(buf: bytes, offset: int, data: bytes) -> bytes:
    return buf[:offset] + data + buf[offset + len(data) :]


def test_truncated_inside_a_header():
    buf = _archive(["a.txt", "b.txt"])
    second = 1024  # header of member 1
    with pytest.raises(CorruptShardError, match=r"test.tar: member 1 at offset 1024: archive is truncated inside a header"):
        tarwalk.walk(buf[: second + 100], "test.tar")


def test_truncated_inside_data():
    buf = tarwrite.member("big.bin", bytes(5000))
    with pytest.raises(
        CorruptShardError, match=r"member 0 \('big.bin'\) at offset 0: data of 5000 bytes runs past the end of the file \(3000 bytes\)"
    ):
        tarwalk.walk(buf[:3000], "test.tar")


def test_size_field_past_the_end():
    buf = _archive(["a.txt"])
    bad = tarwrite.member("a.txt", bytes(10_000))[:512] + buf[512:]  # a header claiming 10000 bytes
    with pytest.raises(CorruptShardError, match="runs past the end of the file"):
        tarwalk.walk(bad, "test.tar")


def test_bad_header_checksum():
    buf = _archive(["a.txt", "b.txt"])
    bad = _corrupt(buf, 1024, b"c")  # rename member 1 without fixing its checksum
    with pytest.raises(CorruptShardError, match=r"member 1 at offset 1024: header checksum is \d+, expected \d+"):
        tarwalk.walk(bad, "test.tar")


def _python_tar(entries: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "a.txt"
            tf.addfile(info, io.BytesIO(b""))
    return out.getvalue()


@pytest.mark.parametrize("name", ["../evil.txt", "a/../../evil.txt", "/etc/evil.txt"])
def test_unsafe_names_are_refused(name):
    buf = _python_tar([("ok.txt", tarfile.REGTYPE), (name, tarfile.REGTYPE)])
    with pytest.raises(CorruptShardError, match=r"member 1 \('.*evil.txt'\) at offset \d+: unsafe member name"):
        tarwalk.walk(buf, "test.tar")


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        (tarfile.SYMTYPE, "symlink"),
        (tarfile.LNKTYPE, "hard link"),
        (tarfile.CHRTYPE, "character device"),
        (tarfile.BLKTYPE, "block device"),
        (tarfile.FIFOTYPE, "fifo"),
    ],
)
def test_links_devices_and_fifos_are_refused(kind, what):
    buf = _python_tar([("a.txt", tarfile.REGTYPE), ("x", kind)])
    with pytest.raises(CorruptShardError, match=rf"member 1 \('x'\) at offset 512: expected a regular file, found a {what}"):
        tarwalk.walk(buf, "test.tar")


def _tree(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


TREE = {"a.bin": b"1", "a.txt": b"one", "b.bin": b"2" * 600, "sub/c.bin": b"3", "sub/deeper/d.txt": b"four"}


def test_directory_entries_of_tar_cf_are_skipped(tmp_path):
    if shutil.which("tar") is None:
        pytest.skip("no tar binary on this machine")
    _tree(tmp_path / "src", TREE)
    archive = tmp_path / "x.tar"
    # what people type: every directory gets an entry ('./', './sub/', ...) in front of its files
    subprocess.run(["tar", "cf", str(archive), "--sort=name", "-C", str(tmp_path / "src"), "."], check=True)
    buf = archive.read_bytes()
    assert tarwalk._walk_plain(buf) is not None  # the vectorized path takes them too
    assert _walked(buf) == {f"./{name}": data for name, data in TREE.items()}
    assert tarwalk._walk_members(buf, "x.tar") == tarwalk.walk(buf, "x.tar")


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_directory_entries_from_python_tarfile_are_skipped(tmp_path, fmt):
    _tree(tmp_path / "src", TREE)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        tf.add(tmp_path / "src", arcname="src")  # directories first, with a pax header each in PAX_FORMAT
    buf = out.getvalue()
    expected = {f"src/{name}": data for name, data in TREE.items()}
    assert _walked(buf) == expected
    assert tarwalk._walk_members(buf, "x.tar") == tarwalk.walk(buf, "x.tar")


def test_an_old_style_directory_entry_is_skipped():
    # before ustar, a directory was a regular entry (typeflag NUL) whose name ends in '/'
    head = bytearray(tarwrite.member("old/", b"")[:512])
    head[156] = 0
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    buf = bytes(head) + tarwrite.member("old/a.txt", b"x") + tarwrite.TRAILER
    assert _walked(buf) == {"old/a.txt": b"x"}


def test_a_directory_entry_that_holds_data_is_refused():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("d")
        info.type, info.size = tarfile.DIRTYPE, 3
        tf.addfile(info, io.BytesIO(b"abc"))  # tarfile writes the data it is given
    with pytest.raises(CorruptShardError, match=r"member 0 \('d/?'\) at offset 0: a directory entry holds 3 bytes of data: expected none"):
        tarwalk.walk(out.getvalue(), "test.tar")


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar"])
def test_archives_made_by_gnu_tar_are_read_completely(tmp_path, fmt):
    if shutil.which("tar") is None:
        pytest.skip("no tar binary on this machine")
    src = tmp_path / "src"
    names = ["a.txt", "sub/b.json", ("x" * 60 + "/") + "y" * 80 + ".bin"]  # 141 bytes: long name in gnu/pax
    if fmt == "ustar":
        names[2] = "x" * 60 + "/" + "y" * 30 + ".bin"  # ustar splits it into prefix/name
    for i, name in enumerate(names):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(bytes([i]) * (700 * i + 3))
    archive = tmp_path / "gnu.tar"
    subprocess.run(["tar", "cf", str(archive), f"--format={fmt}", "--no-recursion", *names], cwd=src, check=True)
    walked = _walked(archive.read_bytes())
    assert walked == {n: (src / n).read_bytes() for n in names}


def test_archives_made_by_webdataset_are_read_completely(tmp_path):
    import webdataset as wds

    path = str(tmp_path / "wds.tar")
    samples = [{"__key__": f"dir/s{i:03d}", "txt": f"text {i}", "cls": str(i % 3), "bin": bytes([i]) * i} for i in range(30)]
    with wds.TarWriter(path) as w:
        for s in samples:
            w.write(s)
    with open(path, "rb") as f:
        buf = f.read()
    members = tarwalk.walk(buf, path)
    keys, _ = reference_tar.group(members, path)
    assert keys == [s["__key__"] for s in samples]
    walked = _walked(buf)
    for s in samples:
        for ext in ("txt", "cls", "bin"):
            value = s[ext]
            assert walked[f"{s['__key__']}.{ext}"] == (value.encode() if isinstance(value, str) else value)


def test_group_refuses_a_duplicate_extension_in_one_sample():
    buf = _archive(["k.txt", "k.cls", "k.txt"])
    with pytest.raises(CorruptShardError, match=r"member 2 \('k.txt'\) at offset 2048: sample 'k' already has a 'txt' member"):
        reference_tar.group(tarwalk.walk(buf, "test.tar"), "test.tar")


def test_split_name_and_sample_spans():
    assert reference_tar.split_name("a/b.c/d.e.jpg") == ("a/b.c/d", "e.jpg")
    assert reference_tar.split_name("noext") == ("noext", "")
    buf = _archive(["a.txt", "a.cls", "b.txt"])
    members = tarwalk.walk(buf, "t")
    keys, starts = reference_tar.group(members, "t")
    bounds = reference_tar.sample_spans(members, starts)
    assert keys == ["a", "b"]
    assert bounds == [0, 2048, 3072]


def _with_size_field(header: bytes, field: bytes) -> bytes:
    """``header`` with its 12-byte size field replaced and its checksum recomputed to match."""
    block = bytearray(header[:124] + field.ljust(12, b"\0")[:12] + header[136:512])
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


_SIGNED_SIZES = [b"-0000001000", b"+0000001000", b"0000_001000", b" -000001000", b"00000001 00", b"\xff" + bytes(10) + b"\x01"]


@pytest.mark.parametrize("field", _SIGNED_SIZES)
def test_a_size_that_is_not_unsigned_octal_is_refused_not_looped_on(field):
    good = _archive(["a.txt", "b.txt"])
    bad = _with_size_field(good, field) + good[512:]  # the checksum holds: only the size is wrong
    with pytest.raises(CorruptShardError, match=r"test.tar: member 0 at offset 0: size field .* is not an unsigned octal number"):
        tarwalk.walk(bad, "test.tar")


def test_gnu_base256_sizes_are_read():
    data = b"hello"
    good = tarwrite.member("a.txt", data) + tarwrite.TRAILER
    gnu = _with_size_field(good, b"\x80" + len(data).to_bytes(11, "big")) + good[512:]
    assert _walked(gnu) == {"a.txt": data}


@pytest.mark.parametrize("value", ["-1000", "+5", "1_0", "x"])
def test_a_pax_size_record_that_is_not_unsigned_decimal_is_refused(value):
    records = tarwrite._pax_record("size", value)
    pax = tarwrite._header(tarwrite._PAX_NAME, len(records), b"x") + records + tarwrite._padding(len(records))
    buf = pax + tarwrite.member("a.txt", b"x" * 600) + tarwrite.TRAILER
    with pytest.raises(
        CorruptShardError, match=rf"member 0 at offset 1024: pax size record '{re.escape(value)}' is not an unsigned decimal"
    ):
        tarwalk.walk(buf, "test.tar")


_CONCATENATED = {
    "zero block between members": tarwrite.member("a.txt", b"1") + bytes(512) + tarwrite.member("b.txt", b"2") + tarwrite.TRAILER,
    "two whole archives": _archive(["a.txt"]) + _archive(["b.txt"]),
    "garbage after the trailer": _archive(["a.txt"]) + b"garbage",
}


@pytest.mark.parametrize("buf", _CONCATENATED.values(), ids=_CONCATENATED.keys())
def test_data_after_the_end_of_archive_marker_is_refused(buf):
    end = len(tarwrite.member("a.txt", _payload("a.txt")))
    with pytest.raises(CorruptShardError, match=rf"test.tar: data follows the end-of-archive marker at offset {end}: a concatenated tar"):
        tarwalk.walk(buf, "test.tar")
    with pytest.raises(CorruptShardError, match="data follows the end-of-archive marker"):
        tarwalk._walk_members(buf, "test.tar")


@pytest.mark.parametrize("tail", [b"", bytes(512), bytes(10240 - 1024 - 1024), bytes(100)])
def test_zero_padding_after_the_end_of_archive_marker_is_fine(tail):
    buf = _archive(["a.txt"]) + tail  # GNU tar pads archives to 10240 bytes with zeros
    assert _walked(buf) == {"a.txt": _payload("a.txt")}
