"""The published JSON Schema of the contract's strings says exactly what their
validators take: each `pattern` (read by Python's `re` and by an ECMA-262 engine,
as JSON Schema tools do) accepts a character iff the validator does."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

import jsonschema_rs
import pytest

from gpuloom.events.text import (
    BLANK_RANGES,
    ENV_NAME_PATTERN,
    EXEC_PATTERN,
    PRINTABLE_PATTERN,
    UNPRINTABLE_RANGES,
    VISIBLE_ASCII_PATTERN,
    WORD_PATTERN,
    env_name,
    exec_safe,
    no_blank,
    printable,
    visible_ascii,
)

CASES: list[tuple[str, Callable[[str], str]]] = [
    (PRINTABLE_PATTERN, printable),
    (WORD_PATTERN, no_blank),
    (EXEC_PATTERN, exec_safe),
    (ENV_NAME_PATTERN, env_name),
    (VISIBLE_ASCII_PATTERN, visible_ascii),
]
IDS = ["printable", "a word", "an exec word", "an env name", "visible ASCII"]


def _samples() -> list[int]:
    """Each range's edges and their neighbours, and a few ordinary characters."""
    edges = {
        cp + d for a, b in UNPRINTABLE_RANGES + BLANK_RANGES for cp in (a, b) for d in (-1, 0, 1)
    }
    ordinary = {ord(ch) for ch in "aZ09-_.=~!é中𝔸😀"} | {0x0378, 0xE0000}  # two unassigned
    return sorted(
        cp for cp in edges | ordinary if 0 <= cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF
    )


def _takes(validator: Callable[[str], str], text: str) -> bool:
    try:
        validator(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("pattern", "validator"), CASES, ids=IDS)
def test_the_pattern_takes_what_the_validator_takes(
    pattern: str, validator: Callable[[str], str]
) -> None:
    python = re.compile(pattern)
    ecma = jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
    for cp in _samples():
        text = f"a{chr(cp)}b"
        expected = _takes(validator, text)
        assert bool(python.fullmatch(text)) == expected, (hex(cp), pattern[:40])
        assert ecma.is_valid(text) == expected, hex(cp)


@pytest.mark.parametrize(("pattern", "validator"), CASES[:4], ids=IDS[:4])
def test_a_lone_surrogate_is_refused(pattern: str, validator: Callable[[str], str]) -> None:
    assert not _takes(validator, "a\ud800")


def test_what_is_refused_is_unicode_s_controls_formats_private_use_and_noncharacters() -> None:
    """As `unicodedata` has them, but for code points this Python does not know yet
    (the frozen list has Unicode 15.1's format characters)."""
    refused = re.compile(f"[{PRINTABLE_PATTERN[3:-3]}]")  # the class, not negated
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        category = unicodedata.category(chr(cp))
        noncharacter = 0xFDD0 <= cp <= 0xFDEF or cp & 0xFFFE == 0xFFFE
        if category in ("Cc", "Cf", "Co") or noncharacter:
            assert refused.match(chr(cp)), hex(cp)
        elif refused.match(chr(cp)):
            assert category == "Cn", hex(cp)


def test_whitespace_is_what_str_isspace_finds() -> None:
    blank = re.compile(f"[{WORD_PATTERN[3:-3]}]")
    for cp in range(0x3001):
        if chr(cp).isspace():
            assert blank.match(chr(cp)), hex(cp)
