"""Compressed piles: zstd and gzip written by every writer, read by the loader (local, remote,
cached), checked by verify, shown by info, readable by other tools, and refused clearly when bad."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid

import pytest

import shardkit
from shardkit import manifest, storage
from shardkit.errors import ConfigError, CorruptShardError, ManifestError
from shardkit.tar import compression
from shardkit.tar.shard import iter_shard

CODECS = ["zstd", "gzip"]
SUFFIX = {"zstd": ".tar.zst", "gzip": ".tar.gz"}
# compressible samples: text with few distinct words, as JSON records are
SAMPLES = [
    {"__key__": f"k{i:05d}", "json": {"i": i, "text": " ".join(["alpha", "beta", "gamma"][j % 3] for j in range(i % 50 + 40))}}
    for i in range(300)
]


def _write(out, codec, **kwargs):
    with shardkit.PileWriter(out, piles=4, seed=1, compression=codec, **kwargs) as w:
        for s in SAMPLES:
            w.write(s)
    return str(out)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The same samples written plain, with zstd and with gzip."""
    root = tmp_path_factory.mktemp("compressed")
    return {codec: _write(root / str(codec), codec) for codec in [None, *CODECS]}


def _epoch(source, **kwargs):
    return list(shardkit.loader(source, batch_size=16, seed=2, decode=False, drop_last=False, **kwargs))


# --- the codecs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_and_several_frames(codec):
    data = os.urandom(1000) + b"x" * 100_000
    packed = compression.compress(data, codec, level=compression.DEFAULT_LEVEL[codec])
    assert len(packed) < len(data) and compression.sniff(packed) == codec
    assert compression.decompress(packed, codec, "a", size=len(data)) == data
    assert compression.decompress(packed + packed, codec, "a") == data + data  # what parallel compressors write
    streamed = compression.Compressor(codec, level=1)
    assert (
        compression.decompress(b"".join([streamed.compress(data[:500]), streamed.compress(data[500:]), streamed.finish()]), codec, "a")
        == data
    )


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], r"not valid \w+: corrupt or truncated"),
        # a seekable zstd pile names the frame too
        (lambda b: b[:40] + bytes([b[40] ^ 0x55]) + b[41:], r"(zstd frame 0 of 1 \(bytes 0-\d+\): )?not valid \w+: corrupt or truncated"),
        (lambda b: b"PK\x03\x04" + b[4:], r"not \w+ data: expected the magic bytes .*, found 50 4b"),
        (lambda b: b"", r"not \w+ data: expected the magic bytes .*, found an empty file"),
    ],
)
def test_bad_compressed_bytes_are_a_corrupt_shard_naming_it(codec, damage, message):
    data = b"".join(b"%06d" % i for i in range(20_000))
    packed = compression.compress(data, codec, level=3)
    with pytest.raises(CorruptShardError, match=rf"^x/pile-000003{SUFFIX[codec]}: {message}"):
        compression.decompress(damage(packed), codec, f"x/pile-000003{SUFFIX[codec]}", size=len(data))


def test_unknown_compression_and_levels_are_config_errors():
    for make in (shardkit.PileOptions, lambda **kw: shardkit.ShuffleOptions(**{k: v for k, v in kw.items() if k != "piles"})):
        with pytest.raises(
            ConfigError, match=r"compression: expected one of 'zstd', 'gzip', 'lz4' or None \(no compression\), got 'brotli'"
        ):
            make(piles=2, compression="brotli")
        with pytest.raises(ConfigError, match=r"compression_level: expected an integer between 1 and 22"):
            make(piles=2, compression="zstd", compression_level=23)
        with pytest.raises(ConfigError, match=r"compression_level: only used with a compression"):
            make(piles=2, compression_level=3)
        with pytest.raises(ConfigError, match=r"compression_level: expected an integer between 0 and 16"):
            make(piles=2, compression="lz4", compression_level=17)
    assert shardkit.PileOptions(piles=2, compression="gzip").level == 6
    assert shardkit.PileOptions(piles=2, compression="lz4").level == 0


def test_the_cli_refuses_an_unknown_compression(tmp_path, capsys):
    from shardkit.cli.main import main

    assert main(["pile", str(tmp_path / "a.tar"), "-o", str(tmp_path / "o"), "--piles", "2", "--compression", "brotli"]) == 1
    assert "compression: expected one of 'zstd', 'gzip'" in capsys.readouterr().err


# --- writing and reading -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_piles_read_as_the_plain_ones(datasets, codec):
    plain, packed = manifest.read(datasets[None]), manifest.read(datasets[codec])
    assert [p.name for p in packed.piles] == [f"pile-{i:06d}{SUFFIX[codec]}" for i in range(4)]
    assert sorted(os.listdir(datasets[codec])) == [*(p.name for p in packed.piles), "shardkit.json"]
    for a, b in zip(plain.piles, packed.piles, strict=True):  # the tar inside is the plain pile, byte for byte
        assert (b.compression, b.tar_bytes, b.tar_checksum, b.samples) == (codec, a.bytes, a.checksum, a.samples)
        assert b.bytes < a.bytes / 3
        tar = compression.decompress(storage.read_bytes(os.path.join(datasets[codec], b.name)), codec, b.name)
        assert tar == storage.read_bytes(os.path.join(datasets[None], a.name))
    assert _epoch(datasets[codec]) == _epoch(datasets[None])
    assert _epoch(datasets[codec], verify=False, mix=2) == _epoch(datasets[None], verify=False, mix=2)
    assert shardkit.verify(datasets[codec], quiet=True) == []


def test_plain_manifests_keep_their_form(datasets):
    with open(os.path.join(datasets[None], "shardkit.json")) as f:
        doc = json.load(f)
    assert set(doc["piles"][0]) == {"name", "samples", "bytes", "checksum"}  # old readers read it as before


def test_a_compressed_entry_needs_all_its_fields(datasets):
    with open(os.path.join(datasets["zstd"], "shardkit.json")) as f:
        doc = json.load(f)
    del doc["piles"][1]["tar_checksum"]
    with pytest.raises(ManifestError, match=r"piles\[1\]: a compressed pile needs .*; missing 'tar_checksum'"):
        manifest.parse(json.dumps(doc), "m.json")
    doc["piles"][1]["tar_checksum"], doc["piles"][1]["compression"] = "crc32:00000000", "brotli"
    with pytest.raises(ManifestError, match=r"field 'compression': expected one of 'zstd', 'gzip', 'lz4', got 'brotli'"):
        manifest.parse(json.dumps(doc), "m.json")


def test_info_shows_the_compression_and_ratio(datasets):
    summary = shardkit.info(datasets["zstd"])
    plain = shardkit.info(datasets[None])
    assert summary.compression == "zstd" and plain.compression is None and plain.ratio is None
    assert summary.tar_bytes == plain.bytes and summary.ratio == pytest.approx(plain.bytes / summary.bytes)
    assert summary.loader_ram() == plain.loader_ram()  # the loader holds the tars
    out = subprocess.run([sys.executable, "-m", "shardkit", "info", datasets["zstd"]], capture_output=True, text=True, check=True).stdout
    assert f"(zstd, {summary.ratio:.2f}x smaller:" in out


def test_piles_are_byte_identical_for_any_number_of_workers(tmp_path):
    units = [SAMPLES[i : i + 60] for i in range(0, len(SAMPLES), 60)]
    one = shardkit.preprocess(units, _identity, tmp_path / "a", piles=3, compression="zstd", quiet=True)
    two = shardkit.preprocess(units, _identity, tmp_path / "b", piles=3, workers=2, compression="zstd", quiet=True)
    assert one.piles == two.piles


def _identity(unit):
    return unit


@pytest.mark.parametrize("codec", CODECS)
def test_split_sub_piles_are_compressed(tmp_path, codec):
    m = manifest.read(_write(tmp_path / "d", codec, max_pile_bytes="24KiB"))
    assert m.split_piles > 0 and all(p.name.endswith(SUFFIX[codec]) and p.compression == codec for p in m.piles)
    assert any("-00" in p.name for p in m.piles) and m.samples == len(SAMPLES)
    assert sorted(k for b in _epoch(str(tmp_path / "d")) for k in b["__key__"]) == [s["__key__"] for s in SAMPLES]
    assert shardkit.verify(str(tmp_path / "d"), quiet=True) == []


@pytest.mark.parametrize("codec", CODECS)
def test_shuffle_repile_and_pile_take_and_write_compressed_piles(datasets, tmp_path, codec):
    other = "gzip" if codec == "zstd" else "zstd"
    shuffled = shardkit.shuffle(f"{datasets[codec]}/pile-*", tmp_path / "s", maxcount=100, compression=other, quiet=True)
    assert [p.name for p in shuffled.piles] == [f"shard-{i:06d}{SUFFIX[other]}" for i in range(3)]
    assert all(p.tar_bytes is not None and p.tar_bytes > p.bytes for p in shuffled.piles)
    assert shardkit.verify(str(tmp_path / "s"), quiet=True) == []
    repiled = shardkit.repile(datasets[codec], tmp_path / "r", compression=codec, compression_level=1, quiet=True)
    assert repiled.samples == len(SAMPLES) and all(p.compression == codec for p in repiled.piles)
    piled = shardkit.pile(f"{tmp_path}/s/shard-*", tmp_path / "p", piles=2, quiet=True)  # compressed inputs, plain piles
    assert [p.name for p in piled.piles] == ["pile-000000.tar", "pile-000001.tar"]
    for out in ("r", "p"):
        assert sorted(k for b in _epoch(str(tmp_path / out)) for k in b["__key__"]) == [s["__key__"] for s in SAMPLES]
    from shardkit.cli.main import main

    assert main(["quality", str(tmp_path / "r"), "--batch-size", "32"]) == 0


def test_compressed_plain_shards_are_loader_and_pile_inputs(datasets, tmp_path):
    src = manifest.read(datasets["zstd"]).piles
    urls = [os.path.join(datasets["zstd"], p.name) for p in src]
    assert sum(len(b["__key__"]) for b in _epoch(urls)) == len(SAMPLES)


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_shard_named_tar_says_what_it_is_and_how_to_name_it(datasets, tmp_path, codec):
    # what `gzip -c real.tar > x.tar` makes: before, 'member 0 at offset 0: archive is truncated inside a header'
    tar = storage.read_bytes(os.path.join(datasets[None], "pile-000000.tar"))
    (tmp_path / "x.tar").write_bytes(compression.compress(tar, codec, level=1))
    message = rf"x\.tar: at offset 0: expected a tar header, found {codec} data \(its magic bytes\); .* name it x\.tar{SUFFIX[codec][4:]}$"
    with pytest.raises(CorruptShardError, match=message):
        list(iter_shard(str(tmp_path / "x.tar")))
    with pytest.raises(CorruptShardError, match=message):
        shardkit.pile(str(tmp_path / "x.tar"), tmp_path / "out", piles=2, quiet=True)


@pytest.mark.parametrize("codec", CODECS)
def test_piles_over_a_mebibyte_are_memory_mapped_and_read(tmp_path, codec):
    rng = __import__("numpy").random.default_rng(0)
    with shardkit.PileWriter(tmp_path / "big", piles=1, compression=codec) as w:
        for i in range(40):
            w.write({"__key__": f"b{i:03d}", "bin": rng.bytes(40_000)})
    (pile,) = manifest.read(str(tmp_path / "big")).piles
    assert pile.bytes > storage.local.MAP_MIN  # read through a memory map
    assert sum(len(b["__key__"]) for b in _epoch(str(tmp_path / "big"))) == 40
    assert shardkit.verify(str(tmp_path / "big"), quiet=True) == []


# --- other readers ------------------------------------------------------------------------------


def test_gzip_piles_read_with_tar_tarfile_and_webdataset(datasets):
    import webdataset as wds

    m = manifest.read(datasets["gzip"])
    path = os.path.join(datasets["gzip"], m.piles[0].name)
    names = subprocess.run(["tar", "-tzf", path], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(path) as tf:
        assert tf.getnames() == names and len(names) == m.piles[0].samples
    urls = [os.path.join(datasets["gzip"], p.name) for p in m.piles]
    keys = sorted(s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert keys == [s["__key__"] for s in SAMPLES]


def _tar_zstd() -> bool:
    if shutil.which("tar") is None or shutil.which("zstd") is None:
        return False
    return subprocess.run(["tar", "--zstd", "--help"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _tar_zstd(), reason="needs GNU tar with --zstd and the zstd program")
def test_zstd_piles_read_with_tar_zstd(datasets, tmp_path):
    m = manifest.read(datasets["zstd"])
    path = os.path.join(datasets["zstd"], m.piles[0].name)
    subprocess.run(["tar", "--zstd", "-xf", path, "-C", str(tmp_path)], check=True)
    with tarfile.open(fileobj=io.BytesIO(storage.read_bytes(os.path.join(datasets[None], "pile-000000.tar")))) as tf:
        for member in tf.getmembers():
            assert (tmp_path / member.name).read_bytes() == tf.extractfile(member).read()


# --- damage -------------------------------------------------------------------------------------


def _damaged(datasets, tmp_path, codec, how):
    out = tmp_path / "bad"
    shutil.copytree(datasets[codec], out)
    pile = out / manifest.read(str(out)).piles[1].name
    data = pile.read_bytes()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "flipped":
        data = data[:60] + bytes([data[60] ^ 0x40]) + data[61:]
    else:
        data = b"\0" * 4 + data[4:]
    pile.write_bytes(data)
    return str(out), pile.name


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("how", ["truncated", "flipped", "magic"])
def test_a_damaged_compressed_pile_is_named_by_loader_verify_and_skip(datasets, tmp_path, codec, how):
    out, name = _damaged(datasets, tmp_path, codec, how)
    expected = r"\(truncated\)" if how == "truncated" else "checksum is crc32:"
    with pytest.raises(CorruptShardError, match=rf"{name}: .*{expected}"):
        _epoch(out)
    # without the checksum the size or the codec finds it: still a CorruptShardError naming the pile, no codec traceback
    expected = {"truncated": r"\(truncated\)", "flipped": f"not valid {codec}: corrupt or truncated", "magic": "magic bytes"}[how]
    with pytest.raises(CorruptShardError, match=rf"{name}: .*{expected}") as e:
        _epoch(out, verify=False)
    assert e.value.__cause__ is None  # no zlib or zstd error chained on
    problems = shardkit.verify(out, quiet=True)
    assert {p.name for p in problems} == {name} and {p.kind for p in problems} >= {"compressed"}
    loader = shardkit.loader(out, batch_size=16, decode=False, on_error="skip", drop_last=False)
    assert sum(len(b["__key__"]) for b in loader) == len(SAMPLES) - manifest.read(out).piles[1].samples
    assert loader.stats.skipped_piles == 1


def test_a_tar_checksum_that_disagrees_is_found(datasets, tmp_path):
    out = tmp_path / "t"
    shutil.copytree(datasets["zstd"], out)
    doc = json.loads((out / "shardkit.json").read_text())
    doc["piles"][2]["tar_checksum"] = "crc32:00000000"
    (out / "shardkit.json").write_text(json.dumps(doc))
    with pytest.raises(
        CorruptShardError, match=r"pile-000002.tar.zst: the tar inside has checksum crc32:\w+, the manifest says crc32:00000000"
    ):
        _epoch(str(out))
    (problem,) = shardkit.verify(str(out), quiet=True)
    assert problem.kind == "checksum" and "the tar inside" in problem.message


# --- object stores -------------------------------------------------------------------------------


def test_a_remote_compressed_dataset_reads_as_the_local_one(datasets):
    fsspec = pytest.importorskip("fsspec", reason="remote URLs need the remote extra: pip install 'shardkit[remote]'")
    root = f"memory://bucket-{uuid.uuid4().hex}"
    try:
        for name in os.listdir(datasets["gzip"]):
            storage.write_bytes(storage.join(root, name), storage.read_bytes(os.path.join(datasets["gzip"], name)))
        assert _epoch(root) == _epoch(datasets[None])
        assert shardkit.verify(root, quiet=True) == []
    finally:
        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_s3_piles_are_cached_compressed_and_decompressed_when_read(s3, datasets, tmp_path):
    url = s3.url("zstd")
    m = shardkit.repile(datasets[None], url, seed=2, compression="zstd", quiet=True)
    local = shardkit.repile(datasets[None], tmp_path / "local", seed=2, quiet=True)
    cache = tmp_path / "cache"
    first = _epoch(url, cache_dir=str(cache))
    assert first == _epoch(str(tmp_path / "local")) == _epoch(url, cache_dir=str(cache))
    kept = sorted(os.listdir(cache / "shardkit-piles"))
    copies = [n for n in kept if n.endswith(".tar.zst")]
    assert len(copies) == len(m.piles)
    assert sum(os.path.getsize(cache / "shardkit-piles" / n) for n in copies) == m.bytes < local.bytes


# --- the benchmark ------------------------------------------------------------------------------


def test_the_benchmark_prints_both_tables_the_profile_and_the_epochs(tmp_path):
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "benchmarks", "compression.py")
    args = ["--json-samples", "60", "--jpeg-samples", "12", "--piles", "2", "--repeats", "1", "--dir", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "### ~5 KB JSON samples (60 samples" in out and "### JPEG samples (12 samples" in out
    before, _, rest = out.partition("4 epochs of one loader (60 samples")
    later, _, jpeg = rest.partition("### JPEG")
    tables = before + jpeg
    for row in ("| plain |", "| zstd 3, 1 frame |", "| zstd 3, frames |", "| gzip 6 |", "| lz4 0 |", "| lz4 3 |"):
        assert tables.count(row) == 2
    rows = ("plain", "lz4 0", "lz4 0, one pile at a time (prefetch=1)", "lz4 0, new memory each pile", "zstd 3, frames")
    never = ("lz4 0, the consumer never decodes a block", "lz4 0, one pile at a time, the consumer never decodes a block")
    switch = ("plain, switch interval 0.5 ms", "lz4 0, switch interval 0.5 ms")
    for row in (*rows, *never, *switch, "zstd 3, frames, new memory each pile"):
        assert re.search(rf"^\| {re.escape(row)} \| [\d,]+ \| \d+\.\d\dx \| [\d,]+ \| \d+\.\d\dx \|\s*$", later, re.M), row
    assert "one zstd-3 pile:" in out and "frames, beside a busy thread" in out and "  2 MiB:" in out
    assert re.search(r"lz4 0: reads at \d\.\d\dx plain \(goal >= 0\.7x: (met|MISSED)\), \d+% smaller \(goal >= 40%: (met|MISSED)\)", out)
    assert "lz4 (level 0) beside a busy thread" in out
    assert re.search(r"hand out a plain pile \(loader\) .*: lz4 decodes at \d+\.\d\dx the rate the loader hands a pile out", out)


# --- zstd frames and the seek table ---------------------------------------------------------------


def _framed(data, frame_size=4096):
    from shardkit.tar import zstd_frames

    writer = zstd_frames.FrameWriter(level=3, frame_size=frame_size)
    # uneven chunks: frames are cut by position in the stream, not by how it was handed over
    cuts = [0, *range(1000, len(data), 1777), len(data)]
    return b"".join(writer.compress(data[a:b]) for a, b in itertools.pairwise(cuts)) + writer.finish()


def _text(n):
    return b"".join(b"%08d alpha beta gamma\n" % i for i in range(n))


def test_zstd_piles_are_frames_of_a_fixed_size_with_a_seekable_table():
    import struct

    from shardkit.tar import zstd_frames

    data = _text(5000)  # 130,000 bytes: 31 frames of 4 KiB and a short one
    packed = _framed(data)
    assert packed == _framed(data) and packed == _framed(data, 4096)  # the same bytes every time
    count, descriptor, magic = struct.unpack("<IBI", packed[-9:])
    assert (count, descriptor, magic) == (-(-len(data) // 4096), 0, 0x8F92EAB1)
    start = len(packed) - 9 - 8 * count - 8
    assert struct.unpack_from("<II", packed, start) == (0x184D2A5E, 8 * count + 9)
    frames = zstd_frames.table(packed, "a", size=len(data))
    assert [f.size for f in frames] == [4096] * (count - 1) + [len(data) - 4096 * (count - 1)]
    assert frames[-1].start + frames[-1].stored == start
    for threads in (1, 2, 3, None):
        assert compression.decompress(packed, "zstd", "a", size=len(data), threads=threads) == data


def test_the_default_writer_cuts_frames_independently_of_how_the_tar_arrives():
    data = _text(200_000)  # 5.2 MB: three frames of the default size
    whole = compression.compress(data, "zstd", level=3)
    streamed = compression.Compressor("zstd", level=3)
    chunks = b"".join(streamed.compress(data[i : i + 100_003]) for i in range(0, len(data), 100_003)) + streamed.finish()
    assert whole == chunks
    assert len(compression.zstd_frames.table(whole, "a")) == 3


@pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("tar") is None, reason="needs the zstd and tar programs")
def test_zstd_and_tar_read_a_framed_pile(datasets, tmp_path):
    packed = manifest.read(datasets["zstd"]).piles[0]
    path = os.path.join(datasets["zstd"], packed.name)
    plain = storage.read_bytes(os.path.join(datasets[None], manifest.read(datasets[None]).piles[0].name))
    assert subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout == plain
    listed = subprocess.run(["tar", "--zstd", "-tf", path], capture_output=True, check=True, text=True).stdout.split()
    assert len(listed) == packed.samples
    big = _framed(_text(5000))  # many frames: readers skip the seek table
    (tmp_path / "big.zst").write_bytes(big)
    assert subprocess.run(["zstd", "-dc", str(tmp_path / "big.zst")], capture_output=True, check=True).stdout == _text(5000)


def test_a_stream_reader_reads_a_framed_pile_whole():
    import zstandard

    data = _text(5000)
    with zstandard.ZstdDecompressor().stream_reader(_framed(data), read_across_frames=True) as reader:
        assert reader.read() == data


def test_old_single_frame_piles_and_joined_files_read_as_streams():
    import zstandard

    data = _text(5000)
    single = zstandard.ZstdCompressor(level=3, threads=2, write_checksum=True).compress(data)
    assert compression.zstd_frames.table(single, "a") is None
    assert compression.decompress(single, "zstd", "a", size=len(data)) == data
    joined = _framed(data) + _framed(data)  # the last table lists only the second half
    assert compression.zstd_frames.table(joined, "a") is None
    assert compression.decompress(joined, "zstd", "a", size=2 * len(data)) == data + data


def _entry(packed, i, stored, size):
    import struct

    count = struct.unpack_from("<I", packed, len(packed) - 9)[0]
    at = len(packed) - 9 - 8 * count + 8 * i
    return packed[:at] + struct.pack("<II", stored, size) + packed[at + 8 :]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        # a flipped byte inside frame 3: the frame's own checksum or its decoder says so
        (
            lambda b, f: b[: f[3].start + 100] + bytes([b[f[3].start + 100] ^ 0x55]) + b[f[3].start + 101 :],
            r"zstd frame 3 of 32 \(bytes \d+-\d+\): not valid zstd",
        ),
        (
            lambda b, f: _entry(b, 5, f[5].stored + 10, f[5].size),
            r"the seek table's 32 frames take \d+ bytes, but the table starts at byte \d+",
        ),
        (
            lambda b, f: _entry(_entry(b, 5, f[5].stored + 10, f[5].size), 6, f[6].stored - 10, f[6].size),
            r"zstd frame 6 of 32 \(bytes \d+-\d+\): not a zstd frame",
        ),
        (  # frame 5 cut short: frame 6 starts inside it, and is found first (every header is read before any frame)
            lambda b, f: _entry(_entry(b, 5, f[5].stored - 10, f[5].size), 6, f[6].stored + 10, f[6].size),
            r"zstd frame 6 of 32 \(bytes \d+-\d+\): not a zstd frame",
        ),
        (
            lambda b, f: _entry(b, 7, f[7].stored, f[7].size + 1),
            r"the seek table's frames hold 130001 bytes of tar, the manifest says 130000",
        ),
        (
            lambda b, f: _entry(_entry(b, 7, f[7].stored, f[7].size + 1), 8, f[8].stored, f[8].size - 1),
            r"zstd frame 7 of 32 .*: its header says it holds 4096 bytes, the seek table says 4097",
        ),
        (lambda b, f: b[:-20] + b[-9:], r"the seek table of 32 frames should start at byte \d+ with a skippable frame header"),
        (
            lambda b, f: b[: len(b) // 2] + b[-(8 * 32 + 17) :],
            r"the seek table's 32 frames take \d+ bytes, but the table starts at byte \d+ \(truncated or damaged\)",
        ),
        (lambda b, f: b[:12] + b[-9:], r"the seek table lists 32 frames, more than its 21-byte file holds"),
    ],
)
def test_a_damaged_framed_pile_names_the_pile_and_the_frame(damage, message):
    from shardkit.tar import zstd_frames

    data = _text(5000)
    packed = _framed(data)
    frames = zstd_frames.table(packed, "a")
    url = "x/pile-000003.tar.zst"
    with pytest.raises(CorruptShardError, match=rf"^{url}: {message}"):
        compression.decompress(damage(packed, frames), "zstd", url, size=len(data), threads=2)


def test_decompressing_threads_end_with_the_read():
    import threading

    before = threading.active_count()
    packed = _framed(_text(50_000))
    for _ in range(3):
        compression.decompress(packed, "zstd", "a", threads=3)
    with pytest.raises(CorruptShardError):
        compression.decompress(packed[:2000] + b"\0" * 100 + packed[2100:], "zstd", "a", threads=3)
    assert threading.active_count() == before
