"""NVIDIA Xids from NVML's event API, as the NVIDIA device plugin reads them.

`nvmlDeviceRegisterEvents(handle, XidCriticalError, set)` for each card, then
`nvmlEventSetWait_v2(set, timeout)` in a loop, all on one worker thread: every NVML call
can block on a sick card, and the wait is short so that a stop is seen within a second.
Each event becomes a line in the form of the kernel's own Xid line, so that the classifier
reads it like any other and `faults.merge` keeps one record where both report a fault.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import structlog

from supervisor.faults.records import KernelLine
from supervisor.gpus.base import normalize_bus_id
from supervisor.gpus.nvml import NvmlBackend, as_text, error_code, pynvml_module

log = structlog.get_logger(__name__)
WAIT_MS = 1000
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event that is not a MIG instance's
SOURCE_TAG = "(reported by NVML event)"


def xid_line(bus_id: str, xid: int, gpu_instance: int | None = None) -> str:
    """The kernel's Xid line shape: `NVRM: Xid (PCI:0000:01:00): 79, ...`."""
    bus = bus_id.rsplit(".", 1)[0] if bus_id else "?"
    where = f"PCI:{bus}" if gpu_instance is None else f"PCI:{bus} GPU-I:{gpu_instance:02d}"
    return f"NVRM: Xid ({where}): {xid}, {SOURCE_TAG}"


class XidEvents:
    """Registers every card it can for Xid events and hands each event to `emit`."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self.registered = 0
        self.stop = threading.Event()

    def run(self, emit: Callable[[str], None]) -> None:
        """Blocking, until `stop` is set; returns at once when no card can be registered."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except Exception as e:
            log.warning("nvml_events_unavailable", error=str(e))
            return
        try:
            self.registered = self._register(events)
            if not self.registered:
                return
            for line in self._wait(events):
                emit(line)
        finally:
            try:
                nvml.nvmlEventSetFree(events)
            except Exception as e:
                log.warning("nvml_event_set_free_failed", error=str(e))

    def _register(self, events: Any) -> int:
        nvml, xid_critical = self._nvml, pynvml_module().nvmlEventTypeXidCriticalError
        count = 0
        for handle in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid_critical, events)
                count += 1
            except nvml.NVMLError as e:
                # NOT_SUPPORTED: GeForce before Fermi, some vGPU; the kernel log still speaks.
                log.info("nvml_xid_events_not_registered", error=str(e), code=error_code(e))
        return count

    def _wait(self, events: Any) -> Iterator[str]:
        nvml, nv = self._nvml, pynvml_module()
        timeout, xid_critical = nv.NVML_ERROR_TIMEOUT, nv.nvmlEventTypeXidCriticalError
        while not self.stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(events, WAIT_MS)
            except nvml.NVMLError as e:
                if error_code(e) == timeout:
                    continue
                log.warning("nvml_event_wait_failed", error=str(e))
                return
            if int(data.eventType) != xid_critical:
                continue
            instance = int(getattr(data, "gpuInstanceId", NO_INSTANCE))
            yield xid_line(
                self._bus_id(data.device),
                int(data.eventData),
                None if instance == NO_INSTANCE else instance,
            )

    def _bus_id(self, handle: Any) -> str:
        try:
            return normalize_bus_id(as_text(self._nvml.nvmlDeviceGetPciInfo(handle).busId))
        except Exception:
            return ""


def xid_event_sources(backend: object) -> list[XidEvents]:
    """One XidEvents per NVML backend inside `backend` (wrappers and composites opened)."""
    from supervisor.gpus.allocation import AllocatedBackend
    from supervisor.gpus.composite import CompositeBackend

    if isinstance(backend, AllocatedBackend):
        return xid_event_sources(backend.inner)
    if isinstance(backend, CompositeBackend):
        return [e for b in backend.backends for e in xid_event_sources(b)]
    if isinstance(backend, NvmlBackend):
        return [xid_events(backend)]
    return []


def xid_events(backend: NvmlBackend) -> XidEvents:
    """NVML's Xid events of the cards the backend has opened so far."""
    nvml, handles = backend.event_handles()
    return XidEvents(nvml, handles)


async def xid_event_lines(events: XidEvents) -> AsyncGenerator[KernelLine, None]:
    """The events as KernelLines. The blocking loop runs on a thread of its own, which is
    told to stop (and then returns within WAIT_MS) when the generator is closed."""
    send, receive = anyio.create_memory_object_stream[str](1024)
    token = anyio.lowlevel.current_token()

    def emit(text: str) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.WouldBlock, RuntimeError):
            anyio.from_thread.run_sync(send.send_nowait, text, token=token)

    def work() -> None:
        try:
            events.run(emit)
        finally:
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(send.close, token=token)

    thread = threading.Thread(target=work, name="nvml-xid-events", daemon=True)
    thread.start()
    try:
        async with receive:
            async for text in receive:
                yield KernelLine(text, time.time())
        # Registration failed everywhere or the wait broke: nothing more will come.
        await anyio.sleep_forever()
    finally:
        events.stop.set()
        # Let the wait return and free its event set before NVML may be shut down.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join, WAIT_MS / 1000 + 1)


def nvml_xid_sources(backend: object) -> dict[str, AsyncGenerator[KernelLine, None]]:
    """The event streams of every NVML backend in `backend`, named for the merge."""
    return {f"nvml-{i}": xid_event_lines(e) for i, e in enumerate(xid_event_sources(backend))}
