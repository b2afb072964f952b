"""Every golden log (tests/golden/log-*: a log the real stack of its day wrote, kept
as an archive) still reads, folds to the figures of its day and audits clean: the
contract and the fold evolve, the logs already written stay what they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuloom.testing.golden import expected_of, read_golden

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden").glob("log-*"))


def test_there_is_a_golden_log() -> None:
    assert GOLDEN, "tests/golden/log-* is gone"


@pytest.mark.parametrize("root", GOLDEN, ids=[path.name for path in GOLDEN])
def test_a_golden_log_folds_and_audits_as_on_its_day(root: Path) -> None:
    records = read_golden(root)  # every segment checked against its sha256, every event read
    expected = json.loads((root / "expected.json").read_text())
    found = expected_of(records)
    assert found["audit"]["mismatches"] == []
    assert found == expected
