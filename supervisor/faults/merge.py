"""One fault, one record: Xid lines that reach the daemon twice (from the kernel log and
from NVML's event API) are kept once.

Pure: `XidMerger.admit` sees each line with its source and a monotonic time, and says
whether it is new. Two lines are the same fault when they name the same card (bus) and the
same Xid within `window_s` of each other and came from different sources (one source's
repeats are real repeats: each is a fault of its own).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import anyio
from anyio.abc import ObjectSendStream

from supervisor.faults.records import KernelLine

WINDOW_S = 10.0
_XID = re.compile(r"\bXid\s*\(PCI:([0-9a-fA-F:.]+)[^)]*\):\s*(\d+)")


def attributed_bus(line_bus: str | None, device: str | None) -> str | None:
    """The card a fault line is about: the bus id in its text, else the PCI device the
    kernel filed it under (journal _KERNEL_DEVICE, kmsg DEVICE=), for dev_printk lines
    whose text names none."""
    return line_bus or device or None


def xid_key(text: str) -> tuple[str, int] | None:
    """(bus without the function, Xid) of an Xid line, the bus in lower case, 4-digit domain."""
    m = _XID.search(text)
    if m is None:
        return None
    parts = m.group(1).lower().split(":")
    if len(parts) >= 3:
        parts[0] = f"{int(parts[0], 16):04x}"
    bus = ":".join(parts).split(".")[0]
    return bus, int(m.group(2))


class XidMerger:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, str, tuple[str, int]]] = deque(maxlen=4096)

    def admit(self, text: str, source: str, now: float) -> bool:
        key = xid_key(text)
        if key is None:
            return True
        while self._seen and now - self._seen[0][0] > self.window_s:
            self._seen.popleft()
        for i, (_, other, seen) in enumerate(self._seen):
            if seen == key and other != source:
                del self._seen[i]  # matched once: a third report is a new fault
                return False
        self._seen.append((now, source, key))
        return True


async def feed(
    sources: dict[str, AsyncGenerator[KernelLine, None]],
    on_line: Callable[[KernelLine], None],
    window_s: float = WINDOW_S,
) -> None:
    """Every source's lines to `on_line` as they come, Xid duplicates across sources
    dropped; runs until cancelled (or until every source has ended)."""
    merger = XidMerger(window_s)
    send, receive = anyio.create_memory_object_stream[tuple[str, KernelLine]](256)
    async with anyio.create_task_group() as tg, receive:
        for name, lines in sources.items():
            tg.start_soon(_pump, name, lines, send.clone())
        send.close()
        async for name, line in receive:
            if merger.admit(line.text, name, anyio.current_time()):
                on_line(line)


async def _pump(
    name: str,
    lines: AsyncGenerator[KernelLine, None],
    out: ObjectSendStream[tuple[str, KernelLine]],
) -> None:
    async with out, aclosing(lines):
        async for line in lines:
            await out.send((name, line))
