"""Codecs: encode by extension on write, decode on read; pickle stays shut unless asked."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from PIL import Image

from shardkit.codecs import DEFAULT, Codecs, encode_field
from shardkit.errors import ConfigError, SampleError
from shardkit.loading.decode import Transform


@pytest.mark.parametrize(
    ("ext", "value", "encoded"),
    [
        ("bin", b"\x00\x01", b"\x00\x01"),
        ("anything", bytearray(b"ab"), b"ab"),
        ("txt", "héllo", "héllo".encode()),
        ("cls", 3, b"3"),
        ("cls", np.int64(-2), b"-2"),
        ("id", 12, b"12"),
        ("json", {"a": [1, "é"]}, '{"a":[1,"é"]}'.encode()),
        ("json", [1, 2], b"[1,2]"),
        ("cls", "7", b"7"),  # str passes as text
    ],
)
def test_encode(ext, value, encoded):
    assert DEFAULT.encode(ext, value) == encoded


@pytest.mark.parametrize(
    ("ext", "value"),
    [("txt", "text"), ("cls", 41), ("json", {"k": [1, None, True]}), ("npy", np.arange(12, dtype=np.float32).reshape(3, 4))],
)
def test_round_trip(ext, value):
    back = DEFAULT.decoder(ext)(DEFAULT.encode(ext, value))
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and np.array_equal(back, value)
    else:
        assert back == value


def test_images_encode_from_arrays_and_pil_and_decode_to_numpy_or_pil():
    array = (np.arange(5 * 7 * 3) % 251).astype(np.uint8).reshape(5, 7, 3)
    png = DEFAULT.encode("png", array)
    assert png == DEFAULT.encode("png", Image.fromarray(array))
    assert np.array_equal(DEFAULT.decoder("png")(png), array)
    pil = Codecs(images="pil").decoder("png")(png)
    assert isinstance(pil, Image.Image) and pil.size == (7, 5)
    jpg = DEFAULT.encode("jpg", Image.fromarray(array).convert("RGBA"))  # RGBA converted for JPEG
    assert Image.open(io.BytesIO(jpg)).format == "JPEG"
    assert DEFAULT.decoder("jpg")(jpg).shape == (5, 7, 3)
    assert DEFAULT.decoder("seg.png") is DEFAULT.decoder("png")  # last part of a dotted extension


@pytest.mark.parametrize(
    ("ext", "value", "message"),
    [
        ("foo", {1}, r"no encoder for set values in a .foo field"),
        ("cls", True, r"expected an int"),
        ("cls", 1.5, r"expected an int"),
        ("png", np.zeros((2, 2), dtype=np.float32), r"an image array must be uint8 HW or HWC"),
        ("npy", [1, 2], r"expected a numpy array or bytes"),
        ("json", {"a": {1, 2}}, r"not JSON serializable"),
    ],
)
def test_refusals_become_sample_errors_naming_key_and_field(ext, value, message):
    with pytest.raises(SampleError, match=rf"sample 'k7': field '{ext}': .*{message}"):
        encode_field(DEFAULT, "k7", ext, value)


def test_pickle_is_written_but_never_read_unless_allowed():
    data = DEFAULT.encode("pyd", {"x": 1})
    assert pickle.loads(data) == {"x": 1}
    assert DEFAULT.decoder("pyd") is None  # stays bytes: unpickling runs code from the data
    assert Codecs(allow_pickle=True).decoder("pyd")(data) == {"x": 1}


def test_registered_codecs_decode_a_sample_through_the_loaders_transform():
    codecs = Codecs()
    codecs.register_encoder("rev", lambda v: "".join(reversed(v)).encode())
    codecs.register_decoder("REV", lambda b: b.decode()[::-1])
    assert codecs.encode("rev", ["c", "b", "a"]) == b"abc"
    sample = Transform(codecs, None)({"__key__": "k", "rev": b"cba", "cls": b"4", "unknown": b"raw"}, "x.tar")
    assert sample == {"__key__": "k", "rev": "abc", "cls": 4, "unknown": b"raw"}


def test_bad_image_mode_option():
    with pytest.raises(ConfigError, match=r"images: expected 'numpy' or 'pil', got 'cv2'"):
        Codecs(images="cv2")
