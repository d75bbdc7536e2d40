"""Decode a raw sample's fields by extension, then apply the user's ``map``: one step of the loader.

Errors name where the sample came from: a field that fails to decode is a
:class:`~shardkit.errors.DecodeError` naming the pile, the key and the field; an exception in
``map`` gets a note naming the sample.

    transform = Transform(Codecs(), fn=None)
    sample = transform({"__key__": "k", "cls": b"3"}, "pile-000000.tar")   # {"__key__": "k", "cls": 3}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardkit.codecs import Codecs
from shardkit.errors import DecodeError


@dataclass(frozen=True)
class Transform:
    """Decode a raw sample's fields (naming pile and key on failure), then apply ``fn``."""

    codecs: Codecs | None
    fn: Callable[[dict[str, Any]], Any] | None

    def __call__(self, sample: dict[str, Any], url: str) -> Any:
        if self.codecs is not None:
            decoder = self.codecs.decoder
            for ext, value in sample.items():
                if ext[:2] == "__":
                    continue
                fn = decoder(ext)
                if fn is None:
                    continue
                try:
                    sample[ext] = fn(value)
                except Exception as e:
                    key = sample.get("__key__")
                    raise DecodeError(f"{url}: sample {key!r}: field {ext!r} cannot be decoded ({type(e).__name__}: {e})") from e
        if self.fn is not None:
            try:
                return self.fn(sample)
            except StopIteration as e:  # left as it is, the loop it rises through would take it for its end: the epoch cut short
                raise RuntimeError(f"map() raised StopIteration on sample {sample.get('__key__')!r} of {url}") from e
            except Exception as e:
                if hasattr(e, "add_note"):  # Python 3.11+
                    e.add_note(f"shardkit: in map() on sample {sample.get('__key__')!r} of {url}")
                raise
        return sample
