"""Re-pile a shardkit dataset with a new seed: fresh pile membership for later epochs.

Epochs after the first reuse pile membership (pile-mates meet in a batch about M times more
often than under fresh shuffles). :func:`repile` runs pass 1 again over the dataset's own piles
with a new seed, in one read and one write, so the new dataset's piles share no more than chance
with the old ones. Train on the old dataset while the new one is written, then switch.

    shardkit.repile("data/", "data-2/", seed=1)   # same M, new membership
    shardkit.repile("data/", "data-3/", options=PileOptions(piles=128, seed=2, workers=8))
"""

from __future__ import annotations

import os
from typing import Any

from shardkit import manifest, storage
from shardkit._util import check_bool, check_path
from shardkit.errors import ConfigError
from shardkit.manifest import Manifest
from shardkit.option_fields import from_call
from shardkit.piles import classes as class_maps
from shardkit.piles import key_prefix
from shardkit.piles.options import REPILE, PileOptions

__all__ = ["repile"]


def _same_place(a: str, b: str) -> bool:
    pa, pb = storage.store_for(a).local_file(), storage.store_for(b).local_file()
    if pa is None or pb is None:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(pa) == os.path.realpath(pb)


@REPILE
def repile(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    options: PileOptions | None = None,
    quiet: bool = False,
    **keywords: Any,
) -> Manifest:
    """Pass 1 again over a dataset's piles, with a new seed, into a new dataset.

    Args:
        src: a shardkit dataset directory (its manifest is read first).
        dst: the new dataset's directory; must not be ``src``.
        options: a :class:`~shardkit.PileOptions` for the new dataset instead of the keyword
            options (not both); its ``piles`` and ``seed`` are used as given.
        quiet: no progress bar.

    The options above are those of :func:`shardkit.pile` that a copy of one whole dataset into
    a new one has a use for; the source's piles may be compressed or not.

    Returns:
        The new dataset's manifest.

    Raises:
        DatasetNotFoundError: ``src`` is not a dataset.
        ConfigError: ``dst`` is ``src``, or ``seed`` is the source's seed.
    """
    from shardkit.piles.preprocess import pile_shards

    keywords = REPILE.keywords(keywords)
    src, dst = check_path("src", src), check_path("dst", dst)
    check_bool("quiet", quiet)
    storage.use([src, dst], options.storage_options if options is not None else keywords["storage_options"])
    m = manifest.read(src)
    if _same_place(src, dst):
        raise ConfigError(f"{dst}: repile writes a new dataset and cannot replace its source in place; write elsewhere, then swap")
    if options is None:  # the source's M and the next seed, unless given
        keywords["piles"] = manifest.original_piles(m) if keywords["piles"] is None else keywords["piles"]
        keywords["seed"] = m.seed + 1 if keywords["seed"] is None else keywords["seed"]
    options = from_call(PileOptions, options, keywords)
    if options.seed == m.seed:
        raise ConfigError(f"seed: {src} was written with seed {m.seed}; repile needs a different seed for new pile membership")
    # a pile that grew: each of its segment files, each checked against its entry as it is read
    listed = {storage.join(src, part.name): part for p in m.piles for part in p.parts}
    # what the samples' labels and keys mean goes with them: an append of images to the new
    # dataset numbers its classes by the same map, verify checks them, a reader strips the prefix
    kept = {k: m.extra[k] for k in (class_maps.CLASSES, class_maps.CHECK_KEY, key_prefix.RECORD) if k in m.extra}
    return pile_shards(list(listed), dst, options, quiet=quiet, listed=listed, kept=kept)
