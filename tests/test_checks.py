"""check_int: one integer check and one message style for every caller."""

from __future__ import annotations

import re

import numpy as np
import pytest

import shardkit
from shardkit._util import check_int, expected_int, shown
from shardkit.cli.schema import Fields, positive_int


@pytest.mark.parametrize(
    ("kwargs", "value"),
    [({"low": 1}, 1), ({"low": 1}, 10**30), ({"low": 0}, 0), ({"low": 1, "high": 100}, 100), ({"high": -1}, -5), ({}, -7)],
)
def test_accepts_ints_in_bounds_and_returns_them(kwargs, value):
    assert check_int("x", value, **kwargs) == value


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (True, {"low": 1}, "piles: expected an integer >= 1, got True"),
        (False, {"low": 0}, "piles: expected an integer >= 0, got False"),
        (2.0, {"low": 1}, "piles: expected an integer >= 1, got 2.0"),
        ("3", {"low": 1}, "piles: expected an integer >= 1, got '3'"),
        (None, {"low": 1}, "piles: expected an integer >= 1, got None"),
        (np.True_, {"low": 0}, "piles: expected an integer >= 0, got "),
        (np.int64(0), {"low": 1}, "piles: expected an integer >= 1, got "),
        (0, {"low": 1}, "piles: expected an integer >= 1, got 0"),
        (-1, {"low": 0}, "piles: expected an integer >= 0, got -1"),
        (101, {"low": 1, "high": 100}, "piles: expected an integer between 1 and 100, got 101"),
        (0, {"low": 1, "high": 100}, "piles: expected an integer between 1 and 100, got 0"),
        (5, {"high": 4}, "piles: expected an integer <= 4, got 5"),
        ("x", {}, "piles: expected an integer, got 'x'"),
        (0, {"low": 1, "none": True}, "piles: expected an integer >= 1 or None, got 0"),
    ],
)
def test_refusals_name_argument_expectation_and_value(value, kwargs, message):
    with pytest.raises(shardkit.ConfigError) as info:
        check_int("piles", value, **kwargs)
    assert str(info.value).startswith(message)


def test_numpy_integers_come_back_as_int():
    value = check_int("piles", np.int64(3), low=1)
    assert value == 3 and type(value) is int


def test_none_only_when_allowed():
    assert check_int("batch_size", None, low=1, none=True) is None
    with pytest.raises(shardkit.ConfigError, match="batch_size: expected an integer >= 1, got None"):
        check_int("batch_size", None, low=1)


def test_error_class_is_the_callers():
    with pytest.raises(ValueError, match="mix: expected an integer >= 1, got 0") as info:
        check_int("mix", 0, low=1, error=ValueError)
    assert not isinstance(info.value, shardkit.ConfigError)


def test_without_a_name_the_message_starts_at_expected():
    with pytest.raises(shardkit.ConfigError, match=r"^expected an integer >= 1, got 'sixty'$"):
        check_int(None, "sixty", low=1)


def test_long_values_are_shortened_and_containers_named():
    assert shown("x" * 100).endswith("...") and len(shown("x" * 100)) == 60
    assert shown([1, 2]) == "a list" and shown({"a": 1}) == "a mapping"
    with pytest.raises(shardkit.ConfigError, match=r"^size: expected an integer >= 0, got a list$"):
        check_int("size", [1], low=0)


def test_expected_int_words():
    assert expected_int() == "an integer"
    assert expected_int(1) == "an integer >= 1"
    assert expected_int(1, 9, none=True) == "an integer between 1 and 9 or None"


def test_yaml_fields_get_file_and_key_path():
    fields = Fields({"piles": True}, source="job.yaml", path="output", allowed=("piles",))
    with pytest.raises(shardkit.ConfigError, match=re.escape("job.yaml: output.piles: expected an integer >= 1, got True")):
        fields.take("piles", positive_int)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: shardkit.PileOptions(piles=True), "piles: expected an integer >= 1, got True"),
        (lambda: shardkit.ShuffleOptions(workers=1.0), "workers: expected an integer >= 1, got 1.0"),
        (lambda: shardkit.LoaderOptions(prefetch="2"), "prefetch: expected an integer >= 0, got '2'"),
        (lambda: shardkit.LoaderOptions(batch_size=0), "batch_size: expected an integer >= 1 or None, got 0"),
    ],
)
def test_option_classes_share_the_style(make, message):
    with pytest.raises(shardkit.ConfigError, match=re.escape(message)):
        make()
