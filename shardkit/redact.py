"""Keep credentials out of text: mask secrets in messages, log records and command lines.

Storage options reach fsspec in memory only. Whatever shardkit writes or prints that could
hold one (an error message, a log line, the command line recorded in a lock) goes through
:func:`mask` first: the values of secret-looking storage options this process was given, the
``user:password`` of a URL, and signed HTTP headers (``Authorization``,
``X-Amz-Security-Token``) become ``***``.

    remember({"key": "AKIA...", "secret": "s3cr3t"})
    mask("GET http://me:pw@host/b?x  Authorization: AWS4-HMAC-SHA256 Credential=AKIA.../s3")
    # 'GET http://***:***@host/b?x  Authorization: ***'
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HIDDEN = "***"
# storage option names whose values are secrets (key, secret, token, password, sas_token, account_key...)
_SECRET_NAME = re.compile(r"key|secret|token|passw|credential|signature|sas|auth", re.IGNORECASE)
# environment variables botocore reads credentials from
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
# shorter values are not masked wherever they occur: they would hide ordinary words
_SHORTEST = 4
# a URL's user name and password, before its host (RFC 3986: no "/", "?" or "#" in them)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s@'\"]+@")
# the same in an endpoint given as an option, up to its last "@": an S3 secret may hold "/" unencoded
_OPTION_USERINFO = re.compile(r"(?P<scheme>https?://)[^\s'\"]*@", re.IGNORECASE)
# a header as botocore dumps it ('Authorization': b'AWS4-HMAC-SHA256 ...') or as HTTP sends it
_HEADER = re.compile(
    r"(?P<name>(?:proxy-)?authorization['\"]?\s*:\s*b?['\"]?|x-amz-security-token['\"]?\s*:\s*b?['\"]?)[^'\"\n]+", re.IGNORECASE
)
# the same in a presigned URL's query
_QUERY = re.compile(r"(?P<name>x-amz-(?:credential|signature|security-token)=)[^&'\"\s]+", re.IGNORECASE)
_CREDENTIAL = re.compile(r"(Credential=)[^/\s,&'\"]+", re.IGNORECASE)

_secrets: set[str] = set()
_lock = threading.Lock()


def remember(options: Mapping[str, Any] | None) -> None:
    """Mask from now on the values of ``options`` (storage options, nested ones too) whose names
    say they are secret, and the password of any URL among them."""
    if not isinstance(options, Mapping):
        return
    found = set(_secret_values(options))
    with _lock:
        _secrets.update(v for v in found if len(v) >= _SHORTEST)


def remember_environment() -> None:
    """Mask the AWS credentials of the environment too (they appear in signed requests)."""
    with _lock:
        _secrets.update(v for name in _SECRET_ENV if len(v := os.environ.get(name, "")) >= _SHORTEST)


def _secret_values(options: Mapping[str, Any]) -> Iterable[str]:
    for name, value in options.items():
        if isinstance(value, Mapping):
            yield from _secret_values(value)
        elif isinstance(value, str):
            if _SECRET_NAME.search(str(name)):
                yield value
            for match in (*_USERINFO.finditer(value), *_OPTION_USERINFO.finditer(value)):
                user, _, password = match.group(0)[len(match.group("scheme")) : -1].partition(":")
                yield from (part for part in (password, f"{user}:{password}") if password)


def mask(text: str) -> str:
    """``text`` with every secret shardkit knows of, URL credentials and signed headers as ``***``."""
    if not isinstance(text, str):
        return text
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{HIDDEN}@", text)
    text = _HEADER.sub(lambda m: f"{m.group('name')}{HIDDEN}", text)
    text = _QUERY.sub(lambda m: f"{m.group('name')}{HIDDEN}", text)
    return _CREDENTIAL.sub(lambda m: f"{m.group(1)}{HIDDEN}", text)


def masked_command(argv: Sequence[str], *, flag: str = "--storage-option") -> str:
    """The command line ``argv`` to record: the value of every ``--storage-option KEY=VALUE``
    hidden whatever its name, and :func:`mask` applied to the rest."""
    shown: list[str] = []
    after_flag = False
    for arg in argv:
        if after_flag:
            key, eq, _ = arg.partition("=")
            arg = f"{key}={HIDDEN}" if eq else HIDDEN
        elif arg.startswith(flag + "="):
            key, eq, _ = arg[len(flag) + 1 :].partition("=")
            arg = f"{flag}={key}={HIDDEN}" if eq else f"{flag}={HIDDEN}"
        after_flag = arg == flag
        shown.append(mask(arg))
    return " ".join(shown)


class MaskingFilter(logging.Filter):
    """A handler filter that masks every record it passes (message, arguments and traceback).

    The CLI installs it on its log handler; a program that logs shardkit's or botocore's debug
    output itself can install it on its own handlers::

        handler.addFilter(MaskingFilter())
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: shown as logging would
            message = f"{record.msg} {record.args}"
        record.msg, record.args = mask(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return True
