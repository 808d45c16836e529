"""Turning `submit`/`run` options into a request, batch files into commands, and a job's
end into an exit status. Pure, apart from reading the batch file."""

from __future__ import annotations

import os
import sys

from supervisor.wire.durations import parse_duration
from supervisor.wire.sizes import ConfigError, parse_size_mb

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: submits start sooner
if TYPE_CHECKING:
    from typing import Any

EXIT_WAIT_TIMEOUT = 124  # `wait`'s own --timeout passed (as timeout(1) does)
EXIT_NO_STATUS = 125  # the job ended without a status of its own
NO_STATUS_REASONS = ("spawn_failed", "dependency_failed")


def exit_status(job: dict[str, Any]) -> int:
    """The job's own status as a shell shows it (its exit code, or 128 + the signal that
    ended it), or EXIT_NO_STATUS when it never had one (cancelled before it started,
    spawn_failed, dependency_failed)."""
    if job.get("state") == "succeeded":
        return 0
    code = job.get("exit_code")
    if code is None or job.get("reason") in NO_STATUS_REASONS:
        return EXIT_NO_STATUS
    return int(code)


def comment_start(line: str) -> int | None:
    """Where a shell comment starts in `line`: a `#` that begins a word outside quotes
    (`frame_####` and `'#x'` are words, ` # note` is a comment)."""
    quote, escaped, word_start = "", False, True
    for i, ch in enumerate(line):
        if escaped:
            escaped, word_start = False, False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote, word_start = ch, False
        elif ch == "#" and word_start:
            return i
        else:
            word_start = ch in " \t"
    return None


_BLANKS = str.maketrans("\t\r", "  ")  # with " ", what shlex (and a shell) splits words at


def batch_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, argv) for each command line, split exactly as a shell splits words."""
    commands = []
    for n, line in enumerate(text.splitlines(), 1):
        if "'" in line or '"' in line or "\\" in line or "#" in line:
            argv = _shell_words(n, line)
        else:  # nothing to unquote or cut: shlex's words, at a tenth of its cost
            argv = [word for word in line.translate(_BLANKS).split(" ") if word]
        if argv:
            commands.append((n, argv))
    if not commands:
        raise ConfigError("--batch: no commands")
    return commands


def _shell_words(n: int, line: str) -> list[str]:
    import shlex  # here: shlex imports re, which a submit without --batch does without

    cut = comment_start(line)
    try:
        return shlex.split(line if cut is None else line[:cut], comments=False)
    except ValueError as exc:
        raise ConfigError(f"--batch line {n}: {exc}") from None


# Each batch source's text, read once a process: a submit for which the lean path
# (quick.py) found no daemon is made again by the parser's path, which must read the same
# commands from stdin or a pipe (`--batch <(...)`) as from a file.
_texts: dict[str, str] = {}


def _batch(source: str, name: str) -> tuple[list[list[str]], list[str]]:
    try:
        if source in _texts:
            text = _texts[source]
        elif source == "-":
            text = _texts[source] = sys.stdin.read()
        else:
            with open(source) as f:  # the locale's encoding, as Path.read_text had it
                text = _texts[source] = f.read()
    except OSError as exc:
        raise ConfigError(f"--batch: cannot read {source}: {exc.strerror or exc}") from None
    prefix = name or ("stdin" if source == "-" else os.path.basename(source.rstrip("/")))
    lines = batch_commands(text)
    return [argv for _, argv in lines], [f"{prefix}:{n}"[:256] for n, _ in lines]


def _fitting(request: dict[str, Any]) -> dict[str, Any]:
    """The batch's request, when it fits in one request line; else why not, and what to
    do (told here: gpusvd would refuse it unread, with only its size)."""
    from supervisor.wire import framing

    size = len(framing.encode(request))
    if size <= framing.MAX_LINE:
        return request
    n = len(request["argvs"])
    fits = max(1, n * framing.MAX_LINE // size * 9 // 10)
    raise ConfigError(
        f"--batch: its {n} commands make a request of {size / 2**20:.1f} MiB, and one request "
        f"may be at most 1 MiB: split it into parts of about {fits} lines (each a submit of its "
        "own), or make the lines shorter"
    )


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--label: expected K=V, got {item!r}")
        labels[key] = value
    return labels


def parse_after(values: list[str] | None, flag: str = "--after") -> list[int] | None:
    """Every id of every --after or --after-any (repeated or comma-separated)."""
    if not values:
        return None
    ids = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            if not part.strip().isdigit() or int(part) < 1:
                raise ConfigError(f"{flag}: {part.strip()!r} is not a job id")
            ids.append(int(part))
    return ids


def parse_cards(text: str | None, flag: str) -> list[int] | None:
    """ "0,2-3" -> [0, 2, 3]: card indices, each once, as `--cards` and `--not-cards` take
    them."""
    if text is None:
        return None
    cards: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ConfigError(f"{flag}: {part.strip()!r} is not a card index or a range like 0-3")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first or last > 4095:
            raise ConfigError(f"{flag}: {part.strip()!r} is not a range of card indices")
        cards.update(range(first, last + 1))
    return sorted(cards)


def _pins(a: Any) -> dict[str, Any]:
    """--cards and --not-cards, checked as far as the client can without the machine."""
    cards = parse_cards(a.cards, "--cards")
    not_cards = parse_cards(a.not_cards, "--not-cards")
    if (cards is not None or not_cards is not None) and a.gpus == 0:
        raise ConfigError("--cards/--not-cards apply to GPU jobs, not to --gpus 0")
    if cards is not None:
        left = set(cards) - set(not_cards or ())
        if len(left) < a.gpus:
            raise ConfigError(f"--gpus {a.gpus}, but --cards leaves only {len(left)} card(s)")
    return {"cards": cards, "not_cards": not_cards}


def _seconds(text: str | None, flag: str) -> float | None:
    return None if text is None else parse_duration(text, flag)


def _size(text: str | None, flag: str) -> int | None:
    return None if text is None else parse_size_mb(text, flag)


def job_options(a: Any) -> dict[str, Any]:
    """The request fields that `submit` and `run` share, None ones left out."""
    options: dict[str, Any] = {
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "gpus": a.gpus,
        "vram_mb": _size(a.vram, "--vram"),
        "mem_mb": _size(a.mem, "--mem"),
        "mem_key": a.mem_key,
        "mem_scale": a.mem_scale,
        "name": a.name,
        "labels": _labels(a.label),
        "retries": a.retries,
        "gpu_hang_retries": a.gpu_hang_retries,
        "progress_timeout_s": _seconds(a.progress_timeout, "--progress-timeout"),
        "progress_regex": a.progress_regex,
        "stall_timeout_s": _seconds(a.stall_timeout, "--stall-timeout"),
        "priority": a.priority,
        "after": parse_after(a.after),
        "after_any": parse_after(a.after_any, "--after-any"),
        "time_limit_s": _seconds(a.time, "--time"),
        "share": a.share or None,
        **_pins(a),
    }
    if options["time_limit_s"] == 0:
        raise ConfigError("--time: must be more than 0")
    return {k: v for k, v in options.items() if v is not None}


def command_of(a: Any) -> list[str]:
    return list(a.command[1:] if a.command[:1] == ["--"] else a.command)


def submit_request(a: Any) -> dict[str, Any]:
    request = job_options(a)
    if a.dry_run:
        request["dry_run"] = True
    else:
        # Always one: a submit sent again after a lost connection must not make two jobs.
        # 128 random bits as 32 hex digits (uuid would import platform: ~5 ms here).
        request["request_id"] = getattr(a, "request_id", None) or os.urandom(16).hex()
    command = command_of(a)
    from supervisor.client import arrays

    request.update(arrays.array_options(a.array, a.max_running))
    if a.array is not None and a.batch is not None:
        raise ConfigError("give either --array or --batch, not both")
    if a.batch is not None:
        if command:
            raise ConfigError("give either --batch or a command, not both")
        argvs, names = _batch(a.batch, a.name)
        request.pop("name", None)
        return _fitting({"type": "submit_batch", "argvs": argvs, "names": names, **request})
    if not command:
        raise ConfigError("submit needs a command after --")
    return {"type": "submit", "argv": command, **request}
