"""The word filters in front of the vendors' _LOST searches: a line the search would match
must hold one of the words, or the filter would hide a lost card. Checked on the patterns
themselves (every alternative holds a word) and on every corpus line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.faults import amd, nvidia
from supervisor.faults.classifier import message_of

DATA = Path(__file__).resolve().parent.parent / "data"


def _alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regular expression."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _literal(alternative: str) -> str:
    # Drop escapes of classes and the regex syntax, keep the words.
    return re.sub(r"\\[bBsSdDwW]|\\|[()\[\]?*+^${}]", " ", alternative).lower()


FILTERS = pytest.mark.parametrize(
    ("pattern", "words"),
    [(amd._LOST, amd._LOST_WORDS), (nvidia._LOST, nvidia._LOST_WORDS)],
    ids=["amd", "nvidia"],
)


@FILTERS
def test_every_alternative_holds_a_word(pattern: re.Pattern[str], words: tuple[str, ...]) -> None:
    alternatives = _alternatives(pattern.pattern)
    assert len(alternatives) > 10
    missing = [a for a in alternatives if not any(w in _literal(a) for w in words)]
    assert missing == []


@FILTERS
def test_no_corpus_line_is_hidden_by_the_filter(
    pattern: re.Pattern[str], words: tuple[str, ...]
) -> None:
    messages = [
        message_of(row.split("\t")[4])
        for path in sorted(DATA.glob("kernel-log-*.tsv"))
        for row in path.read_text(encoding="utf-8").splitlines()[1:]
    ]
    matched = [m for m in messages if pattern.search(m)]
    assert len(matched) > 20
    assert [m for m in matched if not any(w in m.lower() for w in words)] == []
