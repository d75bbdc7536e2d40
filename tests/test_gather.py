"""SampleSink writes exactly the bytes PileSink.add writes for the same samples, headers made many at a time."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardkit.errors import SampleError
from shardkit.piles import gather, parts
from shardkit.piles.encode import encode_parts, encode_values
from shardkit.tar.shard import Shard


def _both(tmp_path, samples, piles, buffer_size):
    """The same samples through PileSink.add (members made one by one) and SampleSink.put."""
    one = parts.PileSink(str(tmp_path / "add"), piles, buffer_size)
    many = gather.SampleSink(str(tmp_path / "put"), piles, buffer_size)
    for i, sample in enumerate(samples):
        pile = i * 7 % piles
        pieces, size, _ = encode_parts(sample)
        one.add(pile, pieces, size, -1, sample["__key__"])
        key, exts, values, size_too = encode_values(sample)
        assert size_too == size
        many.put(pile, key, exts, values, size)
    one.flush()
    many.flush()
    return one, many


def _same(one, many):
    piles = len(one.sizes)
    for pile in range(piles):
        if one.counts[pile]:
            with open(one.part(pile), "rb") as f, open(many.part(pile), "rb") as g:
                assert f.read() == g.read(), f"pile {pile}"
        else:  # made empty ahead of a flush, or not at all
            assert not os.path.exists(many.part(pile)) or os.path.getsize(many.part(pile)) == 0
    assert (one.counts, one.sizes, one.crcs) == (many.counts, many.sizes, many.crcs)
    assert [list(s) for s in one.segments] == [list(s) for s in many.segments]
    assert [list(r) for r in one.key_runs] == [list(r) for r in many.key_runs]
    with open(parts.keys_file(one.directory), "rb") as f, open(parts.keys_file(many.directory), "rb") as g:
        assert f.read() == g.read()


_KEYS = st.text(alphabet="aZ09-_/.é \udc80", min_size=1, max_size=120).filter(lambda k: not k.startswith("/"))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(_KEYS, st.sampled_from([("txt",), ("cls", "txt"), ("bin", "json", "x" * 90), ("é",)]), st.integers(0, 3000)),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 5),
    st.sampled_from([1, 4096, 1 << 30]),
)
def test_the_bytes_are_those_of_members_made_one_by_one(tmp_path_factory, drawn, piles, buffer_size):
    samples = []
    for i, (key, exts, size) in enumerate(drawn):
        sample = {"__key__": f"{key.strip('/').replace('..', '_')}{i}", **{ext: bytes([i % 256]) * size for ext in exts}}
        try:
            encode_values(sample)
        except SampleError:  # a key encode_parts refuses as well: not the writer's business here
            continue
        samples.append(sample)
    if not samples:
        return
    one, many = _both(tmp_path_factory.mktemp("g"), samples, piles, buffer_size)
    _same(one, many)


def test_large_fields_and_many_pieces_keep_the_bytes_and_the_checksum(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(0, 20000, 400)] + [gather.LARGE, gather.LARGE + 1, 3 * gather.PIECE, 0, 511]
    samples = [{"__key__": f"k{i:05d}", "bin": rng.bytes(n), "cls": i} for i, n in enumerate(sizes)]
    one, many = _both(tmp_path, samples, 2, 1 << 30)
    _same(one, many)
    with open(many.part(0), "rb") as f:
        shard = Shard(many.part(0), f.read() + bytes(1024))
    assert len(shard) == many.counts[0]


def test_a_key_repeated_at_once_is_refused_with_both_offsets_before_and_after_a_flush(tmp_path):
    sink = gather.SampleSink(str(tmp_path / "p"), 2, 1 << 30)
    for key in ("a", "b"):
        sink.put(0, *encode_values({"__key__": key, "txt": "x"}))
    with pytest.raises(SampleError, match=r"pile 0: sample 2 \(offset 2048\) has the key 'b' of sample 1 \(offset 1024\)"):
        sink.put(0, *encode_values({"__key__": "b", "cls": 1}))
    sink.flush()
    with pytest.raises(SampleError, match=r"pile 0: sample 2 \(offset 2048\) has the key 'b' of sample 1 \(offset 1024\)"):
        sink.put(0, *encode_values({"__key__": "b", "cls": 1}))
    sink.put(1, *encode_values({"__key__": "b", "cls": 1}))  # another pile: found by check_sink if anywhere
    sink.flush()
    assert sink.counts == [2, 1]


def test_a_sample_sink_takes_whole_samples_only(tmp_path):
    sink = gather.SampleSink(str(tmp_path / "p"), 1, 1 << 20)
    pieces, size, _ = encode_parts({"__key__": "a", "txt": "x"})
    with pytest.raises(TypeError, match="put"):
        sink.add(0, pieces, size, -1, "a")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd (Linux)")
@pytest.mark.parametrize("ending", ["close", "abort"])
def test_part_files_stay_open_between_flushes_and_are_closed_at_the_end(tmp_path, ending):
    import shardkit

    def held() -> list[str]:
        # a writeback between flushes holds the staging folder open for a moment: not counted
        return [link for link in map(_link, os.listdir("/proc/self/fd")) if not os.path.isdir(link)]

    everything, before = len(os.listdir("/proc/self/fd")), len(held())
    keep = gather.open_parts()
    piles = keep + 20  # the last 20 reopen their part at each flush
    one = shardkit.PileWriter(str(tmp_path / "one"), piles=1)  # one pile: no part file open before its first flush
    own = len(held()) - before  # what a writer holds besides its parts (the output's lock)
    one.abort()
    w = shardkit.PileWriter(str(tmp_path / "ds"), piles=piles, buffer_size=64 << 10)
    for i in range(3 * piles):
        w.write({"__key__": f"k{i:05d}", "bin": bytes(300)})
    assert len(held()) - before - own == keep
    if ending == "close":
        assert w.close().samples == 3 * piles
    else:
        w.abort()
    assert len(os.listdir("/proc/self/fd")) == everything


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the descriptor of the listing itself, closed by now
        return ""


def test_the_first_part_files_are_made_by_a_thread_that_is_gone_by_the_first_flush(tmp_path):
    import threading

    sink = gather.SampleSink(str(tmp_path / "parts"), piles=5, buffer_size=1 << 30)
    assert "shardkit-part-files" in [t.name for t in threading.enumerate()] or len(sink._open) == 5
    sink.put(3, "a", ("txt",), [b"x"], 1024)
    sink.flush()
    assert "shardkit-part-files" not in [t.name for t in threading.enumerate()]
    assert sorted(sink._open) == list(range(5)) and [os.path.getsize(sink.part(p)) for p in range(5)] == [0, 0, 0, 1024, 0]
    sink.close()
    assert not sink._open
    one = gather.SampleSink(str(tmp_path / "one"), piles=1, buffer_size=1 << 30)  # one pile: made by its first flush
    assert not os.path.exists(one.part(0))
    one.close()


def test_a_part_file_the_thread_cannot_make_is_named_by_the_flush(tmp_path):
    from shardkit.errors import StorageError

    blocked = tmp_path / "parts"
    sink = gather.SampleSink(str(blocked), piles=3, buffer_size=1 << 30)
    sink.close()  # joins the thread; the parts it made are closed
    for p in range(3):
        os.unlink(sink.part(p))
        os.mkdir(sink.part(p))  # a directory where the part file goes: no file can be made there
    sink = gather.SampleSink(str(blocked), piles=3, buffer_size=1 << 30)
    sink.put(1, "a", ("txt",), [b"x"], 1024)
    with pytest.raises(StorageError, match=r"000001\.part"):
        sink.flush()
    sink.close()


def test_a_low_limit_on_open_files_keeps_fewer_parts_open(monkeypatch):
    resource = pytest.importorskip("resource", reason="RLIMIT_NOFILE is a Unix limit")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 4096))
    assert gather.open_parts() == 64
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert gather.open_parts() == gather.OPEN_PARTS


def test_a_sealed_part_is_its_pile_and_a_writer_installs_it_as_it_is(tmp_path):
    """seal() ends each part with the trailer (empty piles included), sizes and checksums stay
    those of the members; PileWriter's piles are those parts, under their names, nothing copied."""
    from shardkit import manifest
    from shardkit.piles.publish import Run, assemble_pile
    from shardkit.piles.writer import PileWriter
    from shardkit.tar.write import TRAILER

    sink = gather.SampleSink(str(tmp_path / "p"), 3, 1 << 30)
    for i in range(5):
        sink.put(i % 2, *encode_values({"__key__": f"k{i}", "txt": "x" * i}))
    sink.flush()
    members = [Path(sink.part(p)).read_bytes() for p in range(2)]
    sink.seal()
    sink.close()
    for pile in range(3):
        data = Path(sink.part(pile)).read_bytes()
        assert data == (members[pile] if pile < 2 else b"") + TRAILER
        assert sink.sizes[pile] == len(data) - len(TRAILER)
        assert manifest.checksum(data[: sink.sizes[pile]]) == sink.crcs[pile]
        # a pile assembled from a sealed run (an append) takes the part as it is: the trailer once
        crc, _ = assemble_pile([Run(sink.part(pile), 0, sink.sizes[pile], sink.crcs[pile], sealed=True)], str(tmp_path / f"a{pile}.tar"))
        assert (tmp_path / f"a{pile}.tar").read_bytes() == data and crc == manifest.checksum(data)

    out = tmp_path / "out"
    with PileWriter(str(out), piles=3, seed=0) as w:
        for i in range(30):
            w.write({"__key__": f"k{i:02d}", "txt": str(i)})
    for info in w.manifest.piles:
        data = (out / info.name).read_bytes()
        assert data.endswith(TRAILER) and len(data) == info.bytes
        assert manifest.format_checksum(manifest.checksum(data)) == info.checksum
        assert len(Shard(info.name, data)) == info.samples
    assert sum(p.samples for p in w.manifest.piles) == 30
