"""`gpusv top`: a live view of the cards, running and held jobs, and recent hangs.

Client side only: it draws what the daemon's `top` request returns and imports nothing of
the daemon. `render` is a pure function of that snapshot and the screen size; `run` is
the terminal loop: cbreak mode on stdin, the alternate screen, one frame per interval,
`q` or Ctrl-C to quit, and the terminal restored however it ends. Without a terminal (or
with `--once`) it prints one snapshot and returns.
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import sys
import termios
import tty
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from supervisor.client.cards import allocation_notes, health_text, util_text

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, hide the cursor
LEAVE = "\x1b[?25h\x1b[?1049l"
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
UNLIMITED = sys.maxsize


def size_text(mb: float | None) -> str:
    """MiB as a short figure: 512MiB, 1.5GiB, 2.0TiB."""
    if mb is None:
        return "-"
    for unit, scale in (("TiB", 1 << 20), ("GiB", 1 << 10)):
        if mb >= scale:
            return f"{mb / scale:.1f}{unit}"
    return f"{mb:.0f}MiB"


def duration_text(seconds: float) -> str:
    s = int(seconds)
    hours, rest = divmod(s, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the last one is left ragged."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in [header, *rows]
    ]


def _command(job: dict[str, Any]) -> str:
    if job.get("name"):
        return str(job["name"])
    return shlex.join(job["argv"]) if job.get("argv") else "-"


def _header(snap: dict[str, Any]) -> list[str]:
    gpus = snap["gpus"]
    ok = sum(1 for g in gpus if g["health"] == "ok")
    line = (
        f"gpusv top: {len(snap['running'])} running, {snap['queued']} queued "
        f"({len(snap['held'])} waiting), GPUs {ok}/{len(gpus)} ok"
    )
    if snap.get("paused"):
        line += "  [paused: no new job starts; gpusv resume]"
    out = [f"{line}  [draining]" if snap.get("draining") else line]
    host = snap.get("host_memory")
    if host:
        out.append(
            f"host RAM: limit {size_text(host['limit_mb'])}  "
            f"available {size_text(host['available_mb'])}  "
            f"projected {size_text(host['projected_mb'])}  "
            f"free for new {size_text(max(0, host['free_for_new_mb']))}"
        )
    out += [f"! {p}" for p in snap.get("problems", [])]
    return out


def _cards(gpus: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            str(g["index"]),
            g["pci_bus_id"] or "?",
            util_text(g.get("utilization_pct")),
            f"{size_text(g['vram_used_mb'])}/{size_text(g['vram_total_mb'])}",
            health_text(g),
            str(g["gpu_hangs"]),
            ",".join(map(str, g["running_jobs"])) or "-",
        ]
        for g in gpus
    ]
    return table(["GPU", "BUS ID", "UTIL", "VRAM", "HEALTH", "HANGS", "JOBS"], rows) + (
        allocation_notes(gpus)
    )


def _running(jobs: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            str(j["id"]),
            ",".join(map(str, j["gpus"])) or "cpu",
            duration_text(j["runtime_s"]),
            size_text(j["rss_mb"]),
            size_text(j["peak_rss_mb"]),
            j.get("progress") or "",
            _command(j),
        ]
        for j in jobs
    ]
    header = ["ID", "GPUS", "RUNTIME", "RSS", "PEAK", "PROGRESS", "COMMAND"]
    return [f"RUNNING ({len(jobs)})", *table(header, rows)]


def _held(jobs: list[dict[str, Any]]) -> list[str]:
    rows = [[str(j["id"]), j.get("name") or "-", j["waiting_for"]] for j in jobs]
    return [f"WAITING ({len(jobs)})", *table(["ID", "NAME", "WAITING FOR"], rows)]


def _hangs(hangs: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            str(h["at"]),
            str(h["job"]),
            str(h["gpu"]),
            str(h["pci_bus_id"]),
            str(h["driver_version"]),
            str((h.get("evidence") or {}).get("source", "")),
        ]
        for h in reversed(hangs)
    ]
    header = ["AT", "JOB", "GPU", "BUS ID", "DRIVER", "EVIDENCE"]
    return [f"RECENT HANGS ({len(hangs)})", *table(header, rows)]


def render(snapshot: dict[str, Any], width: int, height: int) -> list[str]:
    """The screen for one `top` snapshot: at most `height` lines of at most `width`."""
    lines = [
        *_header(snapshot),
        "",
        *_cards(snapshot["gpus"]),
        "",
        *_running(snapshot["running"]),
        "",
        *_held(snapshot["held"]),
    ]
    if snapshot["recent_hangs"]:
        lines += ["", *_hangs(snapshot["recent_hangs"])]
    if len(lines) > height:
        cut = max(0, height - 1)
        lines = [*lines[:cut], f"... {len(lines) - cut} more lines"][:height]
    return [line[:width] for line in lines]


def _quit_requested(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` for a key: `q` quits, any other key refreshes at once."""
    readable, _, _ = select.select([fd], [], [], timeout)
    if not readable:
        return False
    data = os.read(fd, 64)
    return not data or b"q" in data.lower()


def _frame(lines: list[str]) -> str:
    """Overwrite in place (no full clear, so no flicker), then clear what is left below."""
    return HOME + "\n".join(line + CLEAR_LINE for line in lines) + CLEAR_BELOW


def run(
    fetch: Callable[[], dict[str, Any]],
    *,
    once: bool = False,
    interval: float = 1.0,
    out: TextIO | None = None,
    inp: TextIO | None = None,
) -> int:
    """Draw until `q` or Ctrl-C; exit status 0. A fetch error ends it, terminal restored."""
    out = out or sys.stdout
    inp = inp or sys.stdin
    if not interval > 0:
        raise ValueError(f"--interval must be > 0, got {interval}")
    if once or not (out.isatty() and inp.isatty()):
        width = shutil.get_terminal_size().columns if out.isatty() else UNLIMITED
        out.write("\n".join(render(fetch(), width, UNLIMITED)) + "\n")
        return 0
    fd = inp.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        out.write(ENTER)
        while True:
            size = shutil.get_terminal_size()
            out.write(_frame(render(fetch(), size.columns, size.lines)))
            out.flush()
            if _quit_requested(fd, interval):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        out.write(LEAVE)
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
