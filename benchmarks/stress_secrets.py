"""Canary credentials through real CLI jobs at -vv: no file, object or line of output may hold them.

Every job gets a unique access key id, secret and ``user:password`` endpoint as
``--storage-option`` (and nothing else to reach the store: the environment has no credentials,
so the canaries are what the client signs with). The jobs: a pile into ``s3://``, an append, a
verify, a gc, an info at ``-vvv`` (the clients' request dumps too, which must show
``'Authorization': b'***'``), an info with a ``user:password`` endpoint URL, and a local job
holding the lock while a second one is refused by it. Then every file under the work folder (outputs, locks, staging, the
temporary directory), every object of the bucket, and everything each job printed are searched
for each canary.

    leaks, searched = run_canary(moto.endpoint, bucket, work)   # leaks: ["verify stderr: the secret", ...]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Canary:
    """Credentials made to be found: any appearance is a leak."""

    key: str = field(default_factory=lambda: "AKIACANARY" + uuid.uuid4().hex[:10].upper())
    secret: str = field(default_factory=lambda: "canarySecret" + uuid.uuid4().hex)
    user: str = field(default_factory=lambda: "canaryuser" + uuid.uuid4().hex[:6])
    password: str = field(default_factory=lambda: "canarypw" + uuid.uuid4().hex[:12])

    def words(self) -> dict[str, str]:
        return {"access key id": self.key, "secret": self.secret, "URL password": self.password}

    def options(self, endpoint: str, *, with_password: bool = False) -> list[str]:
        if with_password:
            scheme, _, rest = endpoint.partition("://")
            endpoint = f"{scheme}://{self.user}:{self.password}@{rest}"
        pairs = (f"key={self.key}", f"secret={self.secret}", f"endpoint_url={endpoint}")
        return [arg for pair in pairs for arg in ("--storage-option", pair)]


def _environment(work: str) -> dict[str, str]:
    """The environment of every job: no AWS credentials or endpoint of its own, TMPDIR in ``work``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p),
        TMPDIR=os.path.join(work, "tmp"),
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_MAX_ATTEMPTS="1",
    )
    return env


def _shardkit(args: list[str], env: dict[str, str], **kwargs: Any) -> Any:
    started = time.perf_counter()
    try:
        return subprocess.run([sys.executable, "-m", "shardkit", *args], env=env, capture_output=True, text=True, timeout=180, **kwargs)
    finally:
        if os.environ.get("CANARY_TIMES"):
            print(f"{time.perf_counter() - started:5.1f} s  shardkit {' '.join(a for a in args if 'canary' not in a)}", file=sys.stderr)


def _inputs(work: str, name: str) -> str:
    """Two small pile shards to pile, keys unique to ``name``; returns a glob of them."""
    sys.path.insert(0, ROOT)
    import shardkit

    src = os.path.join(work, name)
    with shardkit.PileWriter(src, piles=2, seed=0) as w:
        for i in range(40):
            w.write({"__key__": f"{name}{i:04d}", "txt": str(i)})
    return os.path.join(src, "pile-*.tar")


_WAITER = textwrap.dedent(
    """\
    import os, time

    def samples(unit, flag):
        # holds the job (and its lock) until the test has tried a second job
        deadline = time.monotonic() + 120
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield {"__key__": os.path.basename(unit).split(".")[0], "txt": "1"}
    """
)


def _held_lock(work: str, canary: Canary, endpoint: str, bucket_url: str, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A YAML job holds a local output's lock; a second job is refused by it. Yields (what, text)."""
    job = os.path.join(work, "lockjob")
    os.makedirs(os.path.join(job, "units"), exist_ok=True)
    with open(os.path.join(job, "units", "a.txt"), "w") as f:
        f.write("a")
    with open(os.path.join(job, "canary_waiter.py"), "w") as f:
        f.write(_WAITER)
    flag, out = os.path.join(job, "go"), os.path.join(job, "out")
    with open(os.path.join(job, "job.yaml"), "w") as f:
        f.write(
            f"job: preprocess\ninputs: units/*.txt\nfn: canary_waiter:samples\nargs: {{flag: {flag}}}\n"
            f"output: {{path: out, piles: 2}}\nworkers: 1\n"
        )
    holder = subprocess.Popen(
        [sys.executable, "-m", "shardkit", *canary.options(endpoint), "-vv", "run", os.path.join(job, "job.yaml")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = os.path.join(out, ".shardkit-lock")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (os.path.exists(lock) and os.path.getsize(lock) > 0):
            time.sleep(0.05)
        with open(lock, encoding="utf-8", errors="replace") as f:
            yield "the lock, while held", f.read()
        second = _shardkit([*canary.options(endpoint), "-vv", "pile", f"{bucket_url}/ds/pile-*.tar", "-o", out, "--piles", "2"], env)
        if second.returncode != 1 or "another job is writing here" not in second.stderr:
            yield "refused job (was not refused by the lock)", "NOT REFUSED " + second.stderr[-500:]
        yield "refused job stdout", second.stdout
        yield "refused job stderr", second.stderr
    finally:
        with open(flag, "w"):
            pass
        stdout, stderr = holder.communicate(timeout=180)
    yield "lock holder stdout", stdout
    yield "lock holder stderr", stderr


def _jobs(work: str, canary: Canary, endpoint: str, bucket_url: str, env: dict[str, str], quick: bool) -> Iterator[tuple[str, str]]:
    ds = f"{bucket_url}/ds"
    opts = canary.options(endpoint)
    runs = [("pile", ["pile", _inputs(work, "first"), "-o", ds, "--piles", "2", "-q"])]
    if not quick:
        runs.append(("append", ["pile", _inputs(work, "more"), "-o", ds, "--piles", "2", "--append", "-q"]))
    runs.append(("verify", ["verify", ds]))
    if not quick:
        runs.append(("gc", ["gc", ds, "--grace", "0s"]))
    for name, args in runs:
        done = _shardkit([*opts, "-vv", *args], env)
        if done.returncode != 0:
            yield f"{name} (failed: it must work with the canaries)", "FAILED " + done.stderr[-800:]
        yield f"{name} stdout", done.stdout
        yield f"{name} stderr", done.stderr
    dumps = _shardkit([*opts, "-vvv", "info", ds], env)
    if not re.search(r"Authorization['\"]?:\s*b?['\"]?\*\*\*", dumps.stderr):
        yield "info -vvv (no masked request dump: did the client sign with the canaries?)", "NO DUMP " + dumps.stderr[-300:]
    yield "info -vvv stdout", dumps.stdout
    yield "info -vvv stderr", dumps.stderr
    with_password = _shardkit([*canary.options(endpoint, with_password=True), "-vv", "info", ds], env)
    yield "info with user:password stdout", with_password.stdout
    yield "info with user:password stderr", with_password.stderr
    if not quick:
        yield from _held_lock(work, canary, endpoint, bucket_url, env)


def _files(work: str) -> Iterator[tuple[str, str]]:
    for folder, _, names in os.walk(work):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    yield os.path.relpath(path, work), f.read().decode("latin-1")


def _objects(client: Any, bucket: str) -> Iterator[tuple[str, str]]:
    for path in client.find(bucket):
        yield f"s3://{path}", client.cat_file(path).decode("latin-1")


def run_canary(endpoint: str, bucket: str, client: Any, work: str, *, quick: bool = False) -> tuple[list[str], int]:
    """Run the jobs with fresh canaries against ``bucket`` on ``endpoint``; (leaks, places
    searched). ``client`` is an s3fs filesystem that reads the bucket with other keys."""
    canary = Canary()
    env = _environment(work)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    problems: list[str] = []
    places = 0
    texts = list(_jobs(work, canary, endpoint, f"s3://{bucket}", env, quick))
    for what, text in [*texts, *_files(work), *_objects(client, bucket)]:
        places += 1
        if text.startswith(("FAILED", "NOT REFUSED", "NO DUMP")):
            problems.append(f"{what}: {text[:300]}")
        for word, value in canary.words().items():
            if value in text:
                problems.append(f"{what}: holds the {word}")
    return problems, places


def main() -> int:
    import tempfile

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from s3_server import S3Bucket, start_moto

    with start_moto() as moto, tempfile.TemporaryDirectory(prefix="shardkit-canary-") as work:
        bucket = S3Bucket.create(moto.endpoint)
        leaks, places = run_canary(moto.endpoint, bucket.bucket, bucket.client(), work)
    print(f"canary secrets at -vv: {places} places searched, {len(leaks)} leaks")
    for leak in leaks:
        print("  " + leak)
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
