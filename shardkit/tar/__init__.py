"""The tar format and nothing else: write members, find and walk headers, group members into
samples, and read a whole shard (plain or compressed) into memory.

This folder knows nothing of piles, manifests, loaders or the CLI; everything above it reads and
writes tars through these modules:

- :mod:`~shardkit.tar.write`: members with fixed-metadata headers (byte-identical runs);
- :mod:`~shardkit.tar.scan`: the vectorized header chain of an archive of plain headers;
- :mod:`~shardkit.tar.walk`: the header-by-header walk that handles the rest and names errors;
- :mod:`~shardkit.tar.index`: members grouped into WebDataset samples, as arrays;
- :mod:`~shardkit.tar.keys`: key hashes and the one check (and wording) for a repeated key;
- :mod:`~shardkit.tar.compression`: whole-shard zstd, gzip and lz4: suffixes, magic bytes, codecs;
- :mod:`~shardkit.tar.zstd_frames`: seekable zstd: fixed-size frames, the seek table, parallel decompression;
- :mod:`~shardkit.tar.shard`: :class:`Shard`, a whole shard in memory, samples by number.
"""

from __future__ import annotations

from shardkit.tar.scan import BLOCK
from shardkit.tar.shard import Shard, iter_shard, read_shard
from shardkit.tar.write import TRAILER, member, member_parts

__all__ = ["BLOCK", "TRAILER", "Shard", "iter_shard", "member", "member_parts", "read_shard"]
