"""Every file-name rule of a dataset directory, once: what each name is and who may have written it.

A dataset directory holds the files of its piles (``pile-000003.tar``, a sub-pile
``pile-000003-001.tar``, a segment ``pile-000003.g000002.r4-1.tar``, an eager shuffle's
``shard-000000.tar``; ``.v1`` before ``.tar`` after an overwrite, ``.zst``/``.gz`` after it when
compressed), the key hashes beside segments (``pile-000003.g000002.keys``), the manifest
``shardkit.json``, the kept manifests of older generations (``shardkit.g000002.json``), their
random-access indexes (``shardkit.g000002.idx``), and while a job runs its lock, install journal,
staging directories and temporaries. A name is shardkit's only when it has one of these forms;
whether shardkit *wrote* a given file is for a record to say (see :mod:`shardkit.dataset.owned`).

    kind("pile-000003.g000002.tar")       # "data"
    check_name("../x.tar", "m.json: piles[0]")   # ManifestError
"""

from __future__ import annotations

import re

from shardkit.errors import ManifestError
from shardkit.tar.compression import SUFFIX_PATTERN as _PACKED
from shardkit.tar.compression import suffix as _suffix

MANIFEST = "shardkit.json"
# every name of a job's own records and temporaries in a dataset directory starts so
PREFIX = ".shardkit-"
LOCK = ".shardkit-lock"
# the pass-1 staging directory inside a local output
STAGING = ".shardkit-pass1"
# a writer's or an eager shuffle's staging directory: the prefix, then a random name
STAGING_PREFIX = ".shardkit-staging-"
SHUFFLE_PREFIX = ".shardkit-shuffle-"
# held inside the local staging directory of a remote output's job while it lives
STAGING_LOCK = ".shardkit-staging.lock"
# written first into every staging directory shardkit makes, removed last: the record that the directory is shardkit's
OWNER = ".shardkit-owner.json"
# a pass-1 staging's job record (its fingerprint): a record that the directory is shardkit's too
JOB = "job.json"
# a remote output's record of where its pass-1 staging lives on this machine
REMOTE_STAGING = ".shardkit-pass1.json"
JOURNAL_PREFIX = ".shardkit-install-"
# inside a pass-1 staging: the lock its job holds, each part directory's commit record, where the
# merge assembles the piles, what the merge was asked for, and its record of each finished pile
STAGING_JOB_LOCK = ".lock"
COMMIT = "commit"
MERGING = "piles"
MERGE = "merge.json"
DONE_SUFFIX = ".done"
# the first letters of every name a dataset's files and records have (hidden job files aside)
NAME_PREFIXES = ("pile-", "shard-", "shardkit.")
# the names a manifest may never give a pile: the dataset's own records
RESERVED = frozenset({MANIFEST, LOCK, STAGING, REMOTE_STAGING})

# a pile of pass 1, a split's sub-pile (-001), an append's segment (.g000002, -token on an object
# store), its leaf (.r4-1), a name taken again after an overwrite (.v1); or an eager shuffle's shard
_STEM = r"(?:pile-(\d{6,})(?:-\d{1,6})*(?:\.g\d{6,}(?:-[0-9a-f]{1,32})?)?(?:\.r\d{1,10}-\d{1,10})?|shard-\d{6,})(?:\.v\d{1,6})?"
DATA_FILE = re.compile(_STEM + rf"\.tar{_PACKED}?")
KEYS_FILE = re.compile(_STEM + r"\.keys")
PILE_FILE = re.compile(rf"pile-.*\.tar{_PACKED}?")
SHARD_FILE = re.compile(rf"shard-\d{{6,}}(?:\.v\d+)?\.tar{_PACKED}?")
GENERATION_FILE = re.compile(r"shardkit\.g(\d{6,})\.json")
INDEX_FILE = re.compile(r"shardkit\.g(\d{6,})\.idx")
JOURNAL_FILE = re.compile(re.escape(JOURNAL_PREFIX) + r"[A-Za-z0-9_-]{1,64}\.json")
# a staging directory a job made (its random part), or one renamed for removal (-removed-<id>)
STAGING_DIR = re.compile(
    r"\.shardkit-(?:pass1|staging-[0-9a-f]{32}|shuffle-[0-9a-f]{32}|(?:pass1|staging|shuffle)-[A-Za-z0-9_]{8,32})(?:-removed-[0-9a-f]{8})?"
)
# what an atomic write leaves when it dies: a name of the layout, then .partial-<uuid>
PARTIAL = re.compile(r"(.+)\.partial-[0-9a-f]{32}")
# a pile, a sub-pile of a split (pile-000012-001.tar) or a leaf of a pile an append split (pile-000012.r4-1.tar)
_PILE = re.compile(rf"^pile-(\d+)(?:-\d+)*(?:\.r\d+-\d+)?(?:\.v\d+)?(?:\.g\d+)?\.tar{_PACKED}?$")
# a whole pile pass 1 wrote (not split): pile-000012.tar, .v1.tar after an overwrite, .tar.zst compressed
_WHOLE_PILE = re.compile(rf"^pile-(\d{{6,}})(?:\.v\d+)?\.tar{_PACKED}?$")
# the merge's record of a finished pile, in a pass-1 staging
DONE_FILE = re.compile(r"pile-(\d{6,})\.tar" + re.escape(DONE_SUFFIX))
_TAR_SUFFIX = re.compile(rf"\.tar{_PACKED}?$")
# what an interrupted pass 1 leaves in a directory without a manifest: piles, a staging directory
_UNFINISHED = re.compile(rf"^(pile-\d{{6,}}(-\d{{3}})*\.tar{_PACKED}?|\.shardkit-.*)$")
_MAX_NAME = 255


def pile_name(index: int) -> str:
    """The file of pile ``index`` of pass 1: ``pile-000003.tar`` (a suffix is added when compressed)."""
    return f"pile-{index:06d}.tar"


def shard_name(index: int, codec: str | None = None) -> str:
    """The eager shuffle's output shard ``index``: ``shard-000003.tar`` (``.tar.zst`` with ``codec="zstd"``)."""
    return f"shard-{index:06d}.tar{_suffix(codec)}"


def segment_name(pile: int, generation: int, token: str = "", codec: str | None = None, resolution: int = 1, leaf: int = 0) -> str:
    """``pile-000003.g000002.tar``: generation 2's segment of pile 3; ``token`` goes after a dash,
    a leaf finer than the whole pile adds ``.r<resolution>-<leaf>`` (``pile-000003.g000002.r4-1.tar``),
    ``codec`` its suffix (``.tar.zst``)."""
    dash = f"-{token}" if token else ""
    cut = f".r{resolution}-{leaf}" if resolution > 1 else ""
    return f"pile-{pile:06d}.g{generation:06d}{dash}{cut}.tar{_suffix(codec)}"


def generation_name(generation: int) -> str:
    """The file that keeps generation ``generation``'s manifest: ``shardkit.g000003.json``."""
    return f"shardkit.g{generation:06d}.json"


def index_name(generation: int) -> str:
    """The random-access index of generation ``generation``: ``shardkit.g000003.idx``."""
    return f"shardkit.g{generation:06d}.idx"


def journal_name(token: str) -> str:
    """The install journal of the job ``token`` (32 hex digits): ``.shardkit-install-<token>.json``."""
    return f"{JOURNAL_PREFIX}{token}.json"


def keys_name(segment: str) -> str:
    """The file of sorted key hashes beside a segment or pile: ``pile-000003.g000001.keys``
    (for ``pile-000003.g000001.tar`` or ``.tar.zst``)."""
    return _TAR_SUFFIX.sub("", segment) + ".keys"


def leaf_name(pile: int, resolution: int, leaf: int) -> str:
    """The name of leaf ``leaf`` of ``resolution`` of pile ``pile``: ``pile-000003.r4-1.tar``
    (``pile-000003.tar`` at resolution 1). It names a pile made of segments, never a file."""
    return f"pile-{pile:06d}.tar" if resolution == 1 else f"pile-{pile:06d}.r{resolution}-{leaf}.tar"


def whole_pile(name: str) -> int | None:
    """The index of the pile ``name`` names when it is a whole pile (not a sub-pile of a split), else None."""
    match = _WHOLE_PILE.match(name)
    return int(match.group(1)) if match else None


def pile_number(name: str) -> int | None:
    """The pile of the M pass 1 drew that ``name`` is or is part of (a split's sub-pile, an
    append's leaf); None for a name shardkit's writers do not give piles."""
    match = _PILE.match(name)
    return int(match.group(1)) if match else None


def unfinished(name: str) -> bool:
    """``name`` is what an interrupted pass 1 leaves beside no manifest (a pile, a staging directory)."""
    return _UNFINISHED.match(name) is not None


def kind(name: str) -> str | None:
    """What the layout says ``name`` is: ``"data"`` (a pile, segment or shard file, or key
    hashes), ``"manifest"``, ``"generation"`` (a kept manifest), ``"index"``, ``"journal"``,
    ``"lock"``, ``"staging"`` (a staging directory, or one renamed for removal),
    ``"remote-staging"`` (a remote output's record of its staging), ``"partial"`` (a temporary
    of an atomic write of one of these); None for a name shardkit never gives a file."""
    if DATA_FILE.fullmatch(name) or KEYS_FILE.fullmatch(name):
        return "data"
    if name == MANIFEST:
        return "manifest"
    if GENERATION_FILE.fullmatch(name):
        return "generation"
    if INDEX_FILE.fullmatch(name):
        return "index"
    if JOURNAL_FILE.fullmatch(name):
        return "journal"
    if name == LOCK:
        return "lock"
    if name == REMOTE_STAGING:
        return "remote-staging"
    if STAGING_DIR.fullmatch(name):
        return "staging"
    match = PARTIAL.fullmatch(name)
    if match and kind(match.group(1)) not in (None, "partial", "staging"):
        return "partial"
    return None


def plain(name: object) -> bool:
    """``name`` is a plain base name: a non-empty str without separators, ``..``, NUL or control characters."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= _MAX_NAME
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
        and ".." not in name
        and name.isprintable()
    )


def check_name(name: str, where: str, *, pile: bool = False) -> str:
    """``name`` if a manifest may name it: a plain base name of a pile, segment or shard file
    (``pile``: the name of a pile, which may be a leaf's that names no file).

    Raises:
        ManifestError: a path, a name with a NUL or a control character, a reserved name (the
            manifest, the lock, a journal...) or one of no form a dataset's files have.
    """
    if not plain(name):
        raise ManifestError(f"{where}: pile name {name!r} must be a plain file name (no '/', '\\', '..', NUL or control character)")
    if name in RESERVED or kind(name) not in ("data", None) or KEYS_FILE.fullmatch(name):
        raise ManifestError(f"{where}: pile name {name!r} is a name the dataset keeps for its own records")
    if not DATA_FILE.fullmatch(name):
        raise ManifestError(
            f"{where}: pile name {name!r} is not of the form of a dataset's files "
            "(pile-NNNNNN[...].tar or shard-NNNNNN[...].tar, optionally .zst, .gz or .lz4)"
        )
    return name
