"""The default memory key of releases before the key named the kind of job: kept only
to tell, in a database written by one of them, which jobs had a key of their own
(`--mem-key`) and which a derived one, which the store recomputes by today's rule
(store/rekey.py). Pure; never used for a new job."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence

_HEAD_CHARS = 40
# Options whose value is where output goes: never what the job is.
OUTPUT_OPTIONS = frozenset(
    {"-o", "-O", "--output", "--out", "--outdir", "--output-dir", "--output_dir", "--render-output"}
)
# Options whose value is the program itself (`python -m pkg`, `sh -c 'code'`).
PROGRAM_OPTIONS = frozenset({"-m", "-c", "-e", "--eval", "--python", "-P"})
# A file that a program runs or reads: a name with an extension, not a number or a
# frame pattern (`out/frame_####`, `img_%04d.png` are outputs).
_FILE = re.compile(r"[^=\s]*[^/\s.]\.[A-Za-z][A-Za-z0-9]{0,7}")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _program_words(argv: Sequence[str]) -> list[str]:
    """The words of argv that say which program runs: the executable's basename, the
    value of a program option (`-m mod`, `-c code`), and every argument naming a file
    (with an extension) that is not an output path. Option values, numbers and outputs
    are left out."""
    if not argv:
        raise ValueError("mem_key needs a command")
    words = [os.path.basename(argv[0]) or argv[0]]
    rest = list(argv[1:])
    i = 0
    while i < len(rest):
        word = rest[i]
        name, eq, value = word.partition("=")
        if word in OUTPUT_OPTIONS:
            i += 2
            continue
        if word in PROGRAM_OPTIONS and i + 1 < len(rest):
            words += [word, rest[i + 1]]
            i += 2
            continue
        if eq and name.startswith("-"):
            if name not in OUTPUT_OPTIONS and _is_file(value):
                words.append(word)
        elif _is_file(word):
            words.append(word)
        i += 1
    return words


def _is_file(word: str) -> bool:
    if "#" in word or "%" in word or _NUMBER.fullmatch(word):
        return False
    return _FILE.fullmatch(word) is not None


def legacy_mem_key(argv: Sequence[str]) -> str:
    """A readable head of the program's words plus 8 hex digits of a SHA-256 over them."""
    words = _program_words(argv)
    raw = "\0".join(words).encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(raw).hexdigest()[:8]
    head = " ".join(" ".join(w.split()) for w in words)
    if len(head) > _HEAD_CHARS:
        head = head[: _HEAD_CHARS - 3].rstrip() + "..."
    return f"{head}#{digest}"
