"""Encode field values on write and decode field bytes on read, chosen by extension.

A :class:`Codecs` object is the registry; :data:`DEFAULT` covers images (Pillow), ``.npy``,
``.json``, text and integer labels. Pickle is written on request but never read unless the
reader says ``allow_pickle=True``: unpickling runs code found in the data.

    codecs = Codecs()
    codecs.register_decoder("flac", lambda b: soundfile.read(io.BytesIO(b)))
    loader(path, decode=codecs)
"""

from __future__ import annotations

import functools
import io
import json
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit._util import shown
from shardkit.errors import ConfigError, SampleError

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "gif"})
INT_EXTS = frozenset({"cls", "cls2", "id", "index", "label"})
TEXT_EXTS = frozenset({"txt", "text", "caption", "transcript"})
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})
_PIL_FORMAT = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "ppm": "PPM",
    "pgm": "PPM",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
    "gif": "GIF",
}

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1].lower()


def _encode_image(value: Any, *, ext: str) -> bytes:
    from PIL import Image

    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3):
            raise TypeError(f"an image array must be uint8 HW or HWC, got {value.dtype} {value.shape}")
        value = Image.fromarray(value)
    if not isinstance(value, Image.Image):
        raise TypeError("expected a PIL image, a uint8 numpy array or bytes")
    fmt = _PIL_FORMAT[ext]
    if fmt == "JPEG" and value.mode not in ("RGB", "L", "CMYK"):
        value = value.convert("RGB")
    out = io.BytesIO()
    value.save(out, format=fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    return out.getvalue()


def _encode_npy(value: Any) -> bytes:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError("expected a numpy array or bytes")
    out = io.BytesIO()
    np.save(out, np.asarray(value), allow_pickle=False)
    return out.getvalue()


def _encode_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _encode_int(value: Any) -> bytes:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError("expected an int, str or bytes")
    return b"%d" % int(value)


def _decode_image_numpy(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def _decode_image_pil(data: bytes) -> Any:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def _decode_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


class Codecs:
    """Encoders and decoders by extension; a lookup tries the full extension, then its last part.

    Args:
        images: how images decode: ``"numpy"`` (HWC uint8 RGB) or ``"pil"``.
        allow_pickle: decode ``.pyd``/``.pickle`` fields. Off by default: it runs code from data.
    """

    def __init__(self, *, images: str = "numpy", allow_pickle: bool = False) -> None:
        if images not in ("numpy", "pil"):
            raise ConfigError(f"images: expected 'numpy' or 'pil', got {images!r}")
        self._encoders: dict[str, Encoder] = {}
        self._decoders: dict[str, Decoder] = {}
        image_decoder = _decode_image_numpy if images == "numpy" else _decode_image_pil
        for ext in IMAGE_EXTS:
            self._encoders[ext] = functools.partial(_encode_image, ext=ext)
            self._decoders[ext] = image_decoder
        for ext in INT_EXTS:
            self._encoders[ext] = _encode_int
            self._decoders[ext] = int
        for ext in TEXT_EXTS:
            self._decoders[ext] = lambda b: b.decode("utf-8")
        self._encoders["npy"] = _encode_npy
        self._decoders["npy"] = _decode_npy
        self._encoders["json"] = _encode_json
        self._decoders["json"] = json.loads
        for ext in PICKLE_EXTS:
            self._encoders[ext] = pickle.dumps
            if allow_pickle:
                self._decoders[ext] = pickle.loads

    def register_encoder(self, ext: str, fn: Encoder) -> None:
        """Use ``fn(value) -> bytes`` for fields named ``ext`` (bytes and str always pass as is)."""
        self._encoders[ext.lower()] = fn

    @property
    def encoders(self) -> dict[str, Encoder]:
        """The encoders by extension (a copy)."""
        return dict(self._encoders)

    def register_decoder(self, ext: str, fn: Decoder) -> None:
        """Use ``fn(bytes) -> value`` for fields named ``ext``."""
        self._decoders[ext.lower()] = fn

    def encode(self, ext: str, value: Any) -> bytes:
        """Bytes for one field value. Raises TypeError when no encoder takes this value."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        fn = self._encoders.get(ext.lower()) or self._encoders.get(_last(ext))
        if fn is None:
            raise TypeError(f"no encoder for {type(value).__name__} values in a .{ext} field (pass bytes or str, or register an encoder)")
        return fn(value)

    def decoder(self, ext: str) -> Decoder | None:
        """The decoder for ``ext``, or None: such fields stay bytes."""
        found = self._decoders.get(ext.lower())
        return found if found is not None else self._decoders.get(_last(ext))


DEFAULT = Codecs()


def check_codecs(value: Any) -> Codecs:
    """``value`` if it is a :class:`Codecs`, :data:`DEFAULT` for None; else a ConfigError."""
    if value is None:
        return DEFAULT
    if not isinstance(value, Codecs):
        raise ConfigError(f"codecs: expected a shardkit.Codecs registry or None, got {shown(value)}")
    return value


def encode_field(codecs: Codecs, key: str, ext: str, value: Any) -> bytes:
    """Encode one field, turning a refusal into a SampleError that names key and field."""
    try:
        return codecs.encode(ext, value)
    except (TypeError, ValueError, OSError) as e:
        raise SampleError(f"sample {key!r}: field {ext!r}: {e}") from None
