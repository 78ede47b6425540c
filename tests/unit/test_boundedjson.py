"""Bounds on sandbox JSON are checked before any object is built."""

from __future__ import annotations

import json

import pytest

from corral.boundedjson import BodyTooLarge, JsonBounds, JsonRefused, check, loads

SMALL = JsonBounds(max_bytes=4096, max_depth=8, max_values=64)


def test_an_ordinary_body_parses() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "a, b: {c} [d]"}]}
    assert loads(json.dumps(body).encode(), SMALL) == body


def test_size_is_refused_as_too_large() -> None:
    with pytest.raises(BodyTooLarge):
        check(b"[" + b"1," * 4096 + b"1]", SMALL)


def test_deep_nesting_is_refused() -> None:
    with pytest.raises(JsonRefused, match="deeper"):
        check(b"[" * 9 + b"]" * 9, SMALL)
    check(b"[" * 8 + b"]" * 8, SMALL)


@pytest.mark.parametrize("bomb", [b"[" + b"{}," * 100 + b"{}]", b"[]" * 100, b'{"a":1,' * 50])
def test_many_values_are_refused(bomb: bytes) -> None:
    with pytest.raises(JsonRefused, match="values"):
        check(bomb, SMALL)


def test_brackets_and_commas_inside_strings_do_not_count() -> None:
    text = json.dumps({"code": "{[,:]}" * 300}).encode()
    assert len(loads(text, SMALL)["code"]) == 1800


def test_an_unterminated_string_is_linear_and_malformed() -> None:
    with pytest.raises(ValueError):
        loads(b'{"a": "' + b"\\\\x" * 1000, SMALL)
