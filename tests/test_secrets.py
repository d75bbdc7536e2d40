"""Secrets stay in memory: canary credentials through real CLI jobs at -vv reach no file, object,
log line, error message or repr; the masking itself, unit by unit."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

import shardkit
from shardkit import redact
from shardkit.dataset import lock as output

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def test_canary_credentials_leak_nowhere(s3, tmp_path):
    import stress_secrets

    leaks, searched = stress_secrets.run_canary(s3.endpoint, s3.bucket, s3.client(), str(tmp_path))
    assert leaks == [] and searched > 30


def test_mask_hides_remembered_values_url_passwords_and_signed_headers():
    redact.remember({"key": "AKIAUNITTEST0001", "client_kwargs": {"aws_session_token": "tok-unit-0001"}, "anon": False})
    text = (
        "GET http://alice:pw-unit-0001@127.0.0.1:9000/b/k headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAOTHER/x, "
        "Signature=ab', 'X-Amz-Security-Token': b'FQo-unit'} AKIAUNITTEST0001 tok-unit-0001 "
        "https://h/k?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature=ff&part=2"
    )
    masked = redact.mask(text)
    for secret in ("pw-unit-0001", "alice", "AKIAUNITTEST0001", "tok-unit-0001", "AKIAOTHER", "FQo-unit", "Signature=ab", "=ff"):
        assert secret not in masked
    assert "http://***@127.0.0.1:9000/b/k" in masked and "&part=2" in masked
    assert redact.mask("s3://bucket/pile-000001.tar") == "s3://bucket/pile-000001.tar"
    # an S3 secret may hold "/": an endpoint option's is remembered whole, and masked wherever it shows
    redact.remember({"endpoint_url": "http://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG@127.0.0.1:1"})
    slashed = redact.mask("Custom endpoint `http://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG@127.0.0.1:1` was not a valid URI")
    assert "wJalrXUtnFEMI" not in slashed and "K7MDENG" not in slashed
    assert "wJalrXUtnFEMI" not in redact.mask("the password wJalrXUtnFEMI/K7MDENG, shown alone")
    # an "@" in a URL's path is not a password: the host and path stay readable
    plain = "http://127.0.0.1:8765/users/alice@corp.com/shardkit.json: no such file"
    assert redact.mask(plain) == plain


def test_the_lock_records_a_masked_command_line(tmp_path, monkeypatch):
    argv = ["shardkit", "--storage-option", "secret=lock-secret-1", "--storage-option=token=lock-token-2", "pile", "x", "-o", "o"]
    monkeypatch.setattr(sys, "argv", [*argv, "--storage-option", "endpoint_url=http://u:lock-pw-3@h:1"])
    out = output.claim(str(tmp_path / "out"), overwrite=False)
    try:
        with open(tmp_path / "out" / output.LOCK) as f:
            held = json.load(f)
        assert set(held) == {"pid", "host", "started", "command", "token"} and held["pid"] == os.getpid()
        assert (
            held["command"]
            == "shardkit --storage-option secret=*** --storage-option=token=*** pile x -o o --storage-option endpoint_url=***"
        )
        with pytest.raises(shardkit.DatasetExistsError) as info:
            output.claim(str(tmp_path / "out"), overwrite=False)
        assert "lock-" not in str(info.value) and "secret=***" in str(info.value)
    finally:
        out.release()


def test_errors_and_reprs_never_show_a_secret():
    redact.remember({"secret": "repr-secret-0001"})
    error = shardkit.StorageError("s3://b/k: cannot read: endpoint http://me:repr-pw@h/ said no to repr-secret-0001")
    assert "repr-secret-0001" not in str(error) and "repr-pw" not in str(error)
    options = {"key": "AKIAREPR", "secret": "repr-secret-0001"}
    for made in (shardkit.PileOptions(piles=2, storage_options=options), shardkit.LoaderOptions(storage_options=options)):
        assert "repr-secret-0001" not in repr(made) and "AKIAREPR" not in repr(made)


def test_the_masking_filter_masks_records_their_arguments_and_tracebacks():
    redact.remember({"password": "filter-pw-0001"})
    record = logging.LogRecord("botocore.endpoint", logging.DEBUG, __file__, 1, "sending %s", ({"password": "filter-pw-0001"},), None)
    try:
        raise ValueError("failed with filter-pw-0001")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert redact.MaskingFilter().filter(record)
    assert "filter-pw-0001" not in record.getMessage() and "filter-pw-0001" not in record.exc_text
