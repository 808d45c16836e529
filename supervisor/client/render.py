"""Jobs in words: the `list` table and the `show` page. Sizes in MiB/GiB, times as ages."""

from __future__ import annotations

import time

from supervisor.wire.durations import duration_text

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `list` starts sooner
if TYPE_CHECKING:
    from typing import Any

COMMAND_WIDTH = 60
# The characters shlex.quote leaves a word bare with: its pattern [^\w@%+=:,./-] (ASCII).
_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
_users: dict[int, str] = {}


def size_text(mb: float | None) -> str:
    """MiB for people: 512 MiB, 1.5 GiB, 2.0 TiB."""
    if mb is None:
        return "-"
    for unit, scale in (("TiB", 1 << 20), ("GiB", 1 << 10)):
        if mb >= scale:
            return f"{mb / scale:.1f} {unit}"
    return f"{mb:.0f} MiB"


def user_name(uid: int | None) -> str:
    if uid is None:
        return "-"
    if uid not in _users:
        import pwd

        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = str(uid)
    return _users[uid]


def age(stamp: str | None, now: float | None = None) -> str:
    if not stamp:
        return "-"
    return duration_text((time.time() if now is None else now) - epoch_of(stamp))


def epoch_of(stamp: str) -> float:
    """Seconds since the epoch of the daemon's UTC stamps ("2026-12-01T05:36:30.755Z"),
    without datetime: it would be the biggest import of `gpusv list`."""
    y, mo, d = int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10])
    seconds = int(stamp[11:13]) * 3600 + int(stamp[14:16]) * 60 + float(stamp[17:].rstrip("Z"))
    y -= mo <= 2  # days from 1970-01-01, the civil-calendar way (March-based years)
    era, yoe = divmod(y, 400)
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return days * 86400 + seconds


def one_line(text: str, width: int = COMMAND_WIDTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def shell_join(argv: list[str]) -> str:
    """shlex.join(argv), without shlex: it imports `re` (with `enum`, about 5 ms of a
    `gpusv list`) for the one pattern that _BARE spells out."""
    return " ".join(_shell_word(word) for word in argv)


def _shell_word(word: str) -> str:
    if not word:
        return "''"
    if _BARE.issuperset(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command_text(job: dict[str, Any]) -> str:
    argv = job.get("argv")
    return shell_join(argv) if argv else "-"


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


# GPUS: how many cards the job asked for; CARDS: which it holds (or, ended, held last).
LIST_HEADER = [
    "ID",
    "STATE",
    "USER",
    "GPUS",
    "CARDS",
    "EXIT",
    "TIME",
    "AGE",
    "NAME/COMMAND",
    "NOTE",
]


def cards_text(job: dict[str, Any]) -> str:
    """The cards a running job holds, or those the last attempt of an ended job held; a
    queued job (a retry waiting too) holds none."""
    if job.get("state") == "queued":
        return "-"
    return ",".join(map(str, job.get("gpus") or [])) or "-"


def exit_text(job: dict[str, Any]) -> str:
    """The final exit code (128 + N for signal N), once there is one."""
    code = job.get("exit_code")
    return "-" if code is None else str(code)


def run_time(job: dict[str, Any], now: float) -> str:
    """How long it has run: from its start to its end, or to now while running."""
    started = job.get("started_at")
    if not started or job.get("state") == "queued":  # a retry waits: it is not running
        return "-"
    ended = job.get("ended_at")
    return duration_text(max(0.0, (epoch_of(ended) if ended else now) - epoch_of(started)))


def note_text(job: dict[str, Any], paused: bool) -> str:
    """Why a queued job waits (a paused queue first), what a running one last said, why
    an ended one failed."""
    reason = job.get("reason") if job.get("state") in ("failed", "cancelled") else None
    progress = job.get("progress") or ""
    note = (
        job.get("waiting_for")  # a held job's says so, with how to release it
        or ("held" if job.get("held") else "")
        or "; ".join(str(p) for p in (reason, progress) if p)  # where it had got to
    )
    if paused and job.get("state") == "queued":
        return f"paused; {note}" if note else "paused"
    return str(note)


def list_lines(jobs: list[dict[str, Any]], paused: bool = False) -> list[str]:
    now = time.time()
    rows = []
    for j in jobs:
        what = j.get("name") or command_text(j)
        rows.append(
            [
                str(j["id"]),
                shown_state(j),
                user_name(j.get("owner_uid")),
                str(j.get("gpus_requested", "-")),
                cards_text(j),
                exit_text(j),
                run_time(j, now),
                age(j.get("submitted_at"), now),
                one_line(what) if "argv" in j else "(not yours)",
                one_line(note_text(j, paused)),
            ]
        )
    return table(rows, LIST_HEADER)


def _attempt(at: dict[str, Any]) -> str:
    gpus = ",".join(map(str, at.get("gpus") or [])) or "none"
    if at.get("ended_at") is None:
        end = "running"
    elif at.get("signal") is not None:
        end = f"signal {at['signal']}"
    elif at.get("exit_code") is None and at.get("reason"):
        end = "did not run" if at["reason"].startswith("spawn_") else "ended"
    else:
        end = f"exit {at.get('exit_code')}"
    reason = f" ({at['reason']})" if at.get("reason") else ""
    why = (at.get("evidence") or {}).get("message") if end == "did not run" else None
    reason += f": {why}" if why else ""
    peak = f", peak RSS {size_text(at['peak_rss_mb'])}" if at.get("peak_rss_mb") else ""
    dropped = at.get("output_dropped_bytes")
    peak += f", {dropped} bytes of output dropped (disk full)" if dropped else ""
    pid = at.get("pid") or "-"
    return f"  #{at['n']}  GPUs {gpus}  pid {pid}  {at['started_at']}  {end}{reason}{peak}"


def failure_text(job: dict[str, Any]) -> str:
    """The job's failure reason, with why it could not start where it never did (the
    message of its last `exited` event, or of its last attempt's evidence)."""
    reason = job.get("reason") or ""
    if not reason.startswith("spawn_"):
        return reason
    for ev in reversed(job.get("events") or []):
        if ev.get("kind") == "exited" and str(ev.get("message", "")).startswith(reason):
            return str(ev["message"])
    attempts = job.get("attempts") or [{}]
    why = (attempts[-1].get("evidence") or {}).get("message")
    return f"{reason}: {why}" if why else reason


def _memory(job: dict[str, Any]) -> str:
    """The figure admission uses, which of the declared --mem and the history gave it,
    and the runs behind the history (how many, their peak)."""
    hm = job.get("host_memory")
    if not hm:
        return "no figure yet (first run is measured)"
    runs, peak = hm.get("runs") or 0, hm.get("peak_mb")
    behind = f"{runs} earlier run{'s' if runs != 1 else ''}"
    if peak:
        behind += f" peaked at {size_text(peak)}"
    figure = f"~{size_text(hm['projected_mb'])}"
    if hm["basis"] == "declared":
        if not runs:
            return f"{figure} (declared --mem; no earlier runs)"
        return f"{figure} (declared --mem, larger than the history: {behind})"
    if not runs:  # only a kill for memory: a floor
        return f"{figure} (observed: an earlier run was killed for memory near it)"
    declared = " (larger than the declared --mem)" if job.get("mem_mb") else ""
    return f"{figure} ({hm['basis']}: {behind}){declared}"


def _retries(job: dict[str, Any]) -> str:
    r = job["retries"]
    return (
        f"{r['ordinary']['used']} of {r['ordinary']['budget']} used (any non-zero exit is "
        f"retried; --retries 0 turns it off), GPU hang {r['gpu_hang']['used']} of "
        f"{r['gpu_hang']['budget']}"
    )


def shown_state(job: dict[str, Any]) -> str:
    """`list`'s state column: a running job being stopped, or not yet up, says so."""
    if job.get("stopping"):
        return "stopping"
    return "starting" if job.get("starting") else str(job["state"])


def show_lines(job: dict[str, Any], paused: bool = False) -> list[str]:
    state = job["state"]
    if job.get("stopping"):
        state += " (stopping: signalled, not yet gone)"
    elif job.get("starting"):
        state += " (starting: its process is not up yet)"
    if job.get("held"):
        state += " (held: gpusv release to let it start)"
    if paused and job["state"] == "queued":
        state += " (the queue is paused: gpusv resume to let jobs start)"
    if job.get("waiting_for"):
        state += f": {job['waiting_for']}"
    code = job.get("exit_code")
    labels = ", ".join(f"{k}={v}" for k, v in sorted((job.get("labels") or {}).items()))
    limit = job.get("time_limit_s")
    fields = [
        ("job", f"{job['id']}" + (f"  {job['name']}" if job.get("name") else "")),
        ("state", state),
        ("reason", failure_text(job) or "-"),
        ("exit code", "-" if code is None else str(code)),
        ("command", command_text(job)),
        ("cwd", job.get("cwd") or "-"),
        ("user", user_name(job.get("owner_uid"))),
        ("labels", labels or "-"),
        ("gpus", f"{job['gpus_requested']} asked" + _assigned(job)),
        ("vram", size_text(job.get("vram_mb")) + " per card" if job.get("vram_mb") else "-"),
        ("host memory", _memory(job)),
        ("memory key", job.get("mem_key") or "-"),
        ("priority", str(job.get("priority", 0))),
        ("after", ids_text(job.get("after") or [])),
        ("after any", ids_text(job.get("after_any") or [])),
        ("time limit", duration_text(limit) if limit else "none"),
        ("retries", _retries(job)),
        ("submitted", f"{job.get('submitted_at')} ({age(job.get('submitted_at'))} ago)"),
        ("started", job.get("started_at") or "-"),
        ("ended", job.get("ended_at") or "-"),
    ]
    if job.get("progress"):
        fields.insert(2, ("progress", job["progress"]))
    if job.get("output_dropped_bytes"):
        dropped = f"{job['output_dropped_bytes']} bytes (the disk was full; the job ran on)"
        fields.insert(4, ("output lost", dropped))
    lines = [f"{k:12} {v}" for k, v in fields]
    if job.get("attempts"):
        lines += ["attempts", *(_attempt(a) for a in job["attempts"])]
    if job.get("events"):
        lines.append("events")
        lines += [f"  {ev['at']}  {ev['kind']:16} {ev['message']}" for ev in job["events"]]
    return lines


def _assigned(job: dict[str, Any]) -> str:
    gpus, pinned = job.get("gpus") or [], job.get("cards")
    text = f", only on cards {','.join(map(str, pinned))}" if pinned is not None else ""
    return text + (f", assigned {','.join(map(str, gpus))}" if gpus else "")


def ids_text(ids: list[int]) -> str:
    """[3, 4, 5, 6, 9] -> "3-6, 9": an array's indices stay one short line."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return (
        ", ".join(
            f"{a}-{b}" if b > a + 1 else ", ".join(map(str, range(a, b + 1))) for a, b in runs
        )
        or "-"
    )
