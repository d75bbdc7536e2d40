"""Rows of the reliability campaign on what shardkit may delete: user files, crafted manifests, links at staging, a full disk in an append.

Each row returns a :class:`stress.Row`; a failure is a file shardkit did not write that is gone
or changed, a raw exception (not a ``ShardkitError``), a hang past the timeout, a dataset that
no longer verifies, or a full-disk error that does not say how to go on.

- userfiles: a dataset (written, appended to with a window, maybe compressed) beside files a user
  keeps there under names like shardkit's (``pile-notes.tar``, ``pile-000099.tar``, a folder
  ``pile-dir.tar``, ``shardkit.g000099.json``...), then gc, an overwrite or an append and gc:
  every user file must be there, byte for byte, and the dataset must verify.
- manifests: a dataset's manifest mutated (names that are paths, reserved names, NUL bytes, other
  files of the directory; negative, huge and wrong-typed numbers; bad generation times; fields
  dropped), then read, gc, overwrite, append, an epoch or verify: no file outside the dataset's
  own may go (a crafted manifest may still retire the dataset's own files, as any manifest may),
  reading never deletes, and every error must be a ShardkitError.
- links: a symbolic link to a victim directory at every name staging takes or leaves (the pass-1
  staging, writer and shuffle staging names, renamed leftovers, in the output and in TMPDIR),
  then jobs and gc: the victim must be untouched and each job must succeed or name the link.
- appendfull: an append with 2 workers on a 4 MiB disk (a tmpfs as root, else a write fault
  injected at ``os.writev``/``os.write``): a one-line ShardkitError that says what the staging keeps
  and how to resume or discard it, or that it was removed; after that, a small append succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys

import shardkit
from shardkit import manifest

USER_NAMES = [
    "pile-notes.tar",
    "pile-backup.keys",
    "pile-000099.tar",
    "pile-old.tar.gz",
    "shardkit.g000099.json",
    "pile-000000.g000007.tar",
    "shard-000003.tar",
    "train.py",
    "pile-000001.v3.tar.zst",
]


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int):
    def ring(signum, frame):
        raise _Hang(f"no answer within {seconds}s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _write(out: str, keys: list[str], **options) -> None:
    with shardkit.PileWriter(out, piles=3, **options) as w:
        for key in keys:
            w.write({"__key__": key, "bin": key.encode() * 20})


def _snapshot(paths: list[str]) -> dict[str, bytes | None]:
    seen: dict[str, bytes | None] = {}
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            seen[path] = b"dir:" + "\0".join(sorted(os.listdir(path))).encode()
        else:
            try:
                with open(path, "rb") as f:
                    seen[path] = f.read()
            except OSError:
                seen[path] = None
    return seen


def row_userfiles(row, work: str, trials: int, rng: random.Random):
    for t in range(trials):
        row.tried += 1
        out = os.path.join(work, f"user-{t}")
        codec = rng.choice([None, "zstd"])
        _write(out, [f"a{i}" for i in range(12)], compression=codec)
        if rng.random() < 0.5:
            _write(out, [f"b{i}" for i in range(4)], mode="append", window=1, compression=codec)
        names = rng.sample(USER_NAMES, rng.randint(1, len(USER_NAMES)))
        for name in names:
            with open(os.path.join(out, name), "wb") as f:
                f.write(f"the user's {name} {t}".encode())
        os.mkdir(os.path.join(out, "pile-dir.tar"))
        with open(os.path.join(out, "pile-dir.tar", "inside.txt"), "w") as f:
            f.write("kept")
        paths = [os.path.join(out, n) for n in [*names, "pile-dir.tar"]] + [os.path.join(out, "pile-dir.tar", "inside.txt")]
        before = _snapshot(paths)
        op = rng.choice(["gc", "overwrite", "append+gc"])
        try:
            if op == "overwrite":
                _write(out, [f"c{i}" for i in range(5)], overwrite=True, compression=codec)
            elif op == "append+gc":
                _write(out, [f"d{i}" for i in range(3)], mode="append", window=1, compression=codec)
            shardkit.gc(out, grace=0)
        except shardkit.ShardkitError as e:
            row.fail(f"{op}: {e}")
            continue
        except Exception as e:
            row.fail(f"{op}: raw {type(e).__name__}: {e}")
            continue
        from stress import _sound  # stress.py imports this module: its helper is taken when a row runs

        gone = [p for p, data in _snapshot(paths).items() if data != before[p]]
        if gone or (why := _sound(out)) is not None:
            row.fail(f"{op}: user files changed {[os.path.basename(p) for p in gone]}" if gone else f"{op}: {why}")
        shutil.rmtree(out, ignore_errors=True)
    return row


_BAD_NAMES = [
    "train.py", "shardkit.json", ".shardkit-lock", ".shardkit-pass1", "../outside.tar", "/etc/passwd", "sub/pile-000000.tar",
    "pile-000000.tar\0", "pile-\n000000.tar", "..", ".", "", "x" * 300, "pile-000000.keys", "shardkit.g000000.json",
    ".shardkit-install-0.json", "outside.tar", "pile-000000.tar/..", "C:\\pile-000000.tar", "pile-000001.tar", "pile-000099.tar",
]  # fmt: skip
_BAD_VALUES = [-1, 2**64, 2**200, "12", 1.5, True, None, [], {}, "", "yesterday", "2024-01-01T00:00:00", "2024-01-01T00:00:00+00:00"]


def _mutate(doc: dict, rng: random.Random) -> dict:
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 2)):
        how = 0 if rng.random() < 0.4 else rng.randrange(1, 6)  # names most: they decide what is deleted
        piles = [p for p in doc["piles"] if isinstance(p, dict)] if isinstance(doc.get("piles"), list) else []
        pile = rng.choice(piles) if piles else {}
        segments = pile.get("segments")
        target = rng.choice(segments) if isinstance(segments, list) and segments and isinstance(segments[0], dict) else pile or doc
        if how == 0 and pile:
            target["name"] = rng.choice(_BAD_NAMES)
        elif how == 1:
            target[rng.choice(["samples", "bytes", "generation", "resolution", "leaf", "tar_bytes"])] = rng.choice(_BAD_VALUES)
        elif how == 2:
            doc[rng.choice(["seed", "generation", "samples", "bytes", "skipped_units", "format_version"])] = rng.choice(_BAD_VALUES)
        elif how == 3:
            if not isinstance(doc.get("generations"), dict):
                doc["generations"] = {}
            doc["generations"][rng.choice(["0", "1", "x", "-1", "99999999999"])] = rng.choice(_BAD_VALUES)
        elif how == 4 and target:
            target.pop(rng.choice(list(target)), None)
        else:
            doc[rng.choice(["piles", "fields", "extra", "generations"])] = rng.choice(_BAD_VALUES)
    return doc


def row_manifests(row, work: str, trials: int, rng: random.Random, timeout: int = 30):
    template = os.path.join(work, "manifest-template", "ds")
    _write(template, [f"a{i}" for i in range(12)])
    _write(template, [f"b{i}" for i in range(4)], mode="append", max_pile_bytes=4096)
    with open(os.path.join(template, "shardkit.json")) as f:
        original = json.load(f)
    for t in range(trials):
        row.tried += 1
        base = os.path.join(work, f"manifest-{t}")
        out = os.path.join(base, "ds")
        shutil.copytree(template, out)
        sentinels = [os.path.join(base, "outside.tar"), os.path.join(out, "train.py"), os.path.join(out, "pile-000099.tar")]
        for path in sentinels:
            with open(path, "wb") as f:
                f.write(b"not shardkit's")
        with open(os.path.join(out, "shardkit.json"), "w") as f:
            json.dump(_mutate(original, rng), f)
        own = set(os.listdir(out)) - {os.path.basename(p) for p in sentinels}
        op = rng.choice(["read", "gc", "overwrite", "append", "epoch", "verify"])
        try:
            with _deadline(timeout):
                if op == "read":
                    manifest.read(out)
                elif op == "gc":
                    shardkit.gc(out, grace=0)
                elif op == "overwrite":
                    _write(out, ["c0", "c1"], overwrite=True)
                elif op == "append":
                    _write(out, [f"d{t}"], mode="append")
                elif op == "epoch":
                    for _ in shardkit.loader(out, decode=False):
                        pass
                else:
                    shardkit.verify(out, quiet=True)
        except shardkit.ShardkitError:
            pass
        except _Hang as e:
            row.fail(f"{op}: {e}")
        except Exception as e:
            row.fail(f"{op}: raw {type(e).__name__}: {e}")
        missing = [p for p in sentinels if not os.path.exists(p)]
        if missing:
            row.fail(f"{op}: deleted {[os.path.basename(p) for p in missing]}")
        elif op in ("read", "epoch", "verify") and not own <= set(os.listdir(out)):
            row.fail(f"{op}: deleted the dataset's own {sorted(own - set(os.listdir(out)))[:3]}")
        shutil.rmtree(base, ignore_errors=True)
    return row


def _units(unit: int):
    for k in range(5):
        yield {"__key__": f"u{unit:04d}-{k}", "bin": bytes([unit % 251]) * 500}


def row_links(row, work: str, trials: int, rng: random.Random):
    from shardkit.dataset import leftovers

    temp = os.path.join(work, "links-tmp")
    os.makedirs(temp, exist_ok=True)
    victim = os.path.join(work, "victim")
    for t in range(trials):
        shutil.rmtree(victim, ignore_errors=True)
        os.makedirs(os.path.join(victim, "sub"))
        for name, text in (("thesis.tex", "chapter 1"), ("sub/data.csv", "1,2")):
            with open(os.path.join(victim, name), "w") as f:
                f.write(text)
        out = os.path.join(work, f"links-{t}")
        os.makedirs(out)
        hexes = hashlib.sha256(str(t).encode()).hexdigest()
        where = rng.choice(
            [
                (out, ".shardkit-pass1"),
                (out, f".shardkit-staging-{hexes[:32]}"),
                (out, f".shardkit-shuffle-{hexes[:32]}"),
                (out, f".shardkit-pass1-removed-{hexes[:8]}"),
                (temp, f".shardkit-staging-{hexes[:32]}"),
                (temp, f".shardkit-pass1-{hexes[:16]}"),
                (temp, f".shardkit-pass1-{hexes[:8]}-removed-{hexes[8:16]}"),
            ]
        )
        link = os.path.join(*where)
        os.symlink(victim if rng.random() < 0.8 else os.path.join(victim, "thesis.tex"), link)
        row.tried += 1
        op = rng.choice(["preprocess", "writer", "append+gc", "tmpdir"])
        try:
            if op == "tmpdir" or where[0] == temp:
                leftovers.clear_dead_staging(temp)  # what a remote job's claim does to TMPDIR
            if op == "preprocess" or op == "append+gc":
                shardkit.preprocess(range(3), _units, out, piles=2, quiet=True)
            if op == "writer":
                _write(out, ["a0", "a1"])
            if op == "append+gc":
                shardkit.preprocess(range(3, 5), _units, out, piles=2, mode="append", quiet=True)
                shardkit.gc(out, grace=0)
        except shardkit.ShardkitError as e:
            if link not in str(e):
                row.fail(f"{op} with a link at {where[1]}: an error that does not name it: {e}")
        except Exception as e:
            row.fail(f"{op}: raw {type(e).__name__}: {e}")
        intact = _snapshot([os.path.join(victim, "thesis.tex"), os.path.join(victim, "sub", "data.csv")])
        if list(intact.values()) != [b"chapter 1", b"1,2"] or not os.path.islink(link):
            row.fail(f"{op} with a link at {where[1]}: the victim or the link changed")
        with contextlib.suppress(OSError):
            os.unlink(link)
        shutil.rmtree(out, ignore_errors=True)
    return row


def _injected_full(root: str, budget: int):
    real_writev, real_write, spent = os.writev, os.write, [0]

    def spend(fd: int, size: int) -> None:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(root):
                if spent[0] + size > budget:
                    raise OSError(errno.ENOSPC, "No space left on device")
                spent[0] += size

    os.writev = lambda fd, buffers: (spend(fd, sum(map(len, buffers))), real_writev(fd, buffers))[1]  # type: ignore[assignment]
    os.write = lambda fd, data: (spend(fd, len(data)), real_write(fd, data))[1]  # type: ignore[assignment]
    return lambda: (setattr(os, "writev", real_writev), setattr(os, "write", real_write))


def row_appendfull(row, work: str, trials: int, rng: random.Random):
    mount = os.path.join(work, "appendfull")
    os.makedirs(mount, exist_ok=True)
    real = sys.platform.startswith("linux") and os.geteuid() == 0
    if real:
        real = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], capture_output=True).returncode == 0
    undo = None if real else _injected_full(mount, 1 << 20)
    row.notes.append("a real tmpfs" if real else "an injected ENOSPC")
    try:
        for t in range(trials):
            row.tried += 1
            out = os.path.join(mount, f"ds-{t}")
            shardkit.preprocess(range(4), _units, out, piles=2, quiet=True)
            staging = os.path.join(out, ".shardkit-pass1")
            try:
                shardkit.preprocess(range(10, 10 + rng.randint(400, 1200)), _units, out, piles=2, mode="append", workers=2, quiet=True)
                row.fail("an append that cannot fit reported success")
            except shardkit.ShardkitError as e:
                said = str(e)
                if "\n" in said or not (("resume=True" in said and f"delete {staging}" in said) or "is removed" in said):
                    row.fail(f"the error does not say how to go on: {said}")
            except Exception as e:
                row.fail(f"raw {type(e).__name__}: {e}")
            if os.path.isdir(os.path.join(staging, "piles")):
                row.fail("the publish scratch, which no resume uses, was kept")
            shutil.rmtree(staging, ignore_errors=True)  # what the message says
            try:
                shardkit.preprocess(range(5000, 5002), _units, out, piles=2, mode="append", quiet=True)
            except shardkit.ShardkitError as e:
                row.fail(f"the next small append failed: {e}")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if undo is not None:
            undo()
        if real:
            subprocess.run(["umount", "-l", mount], capture_output=True)
    return row
