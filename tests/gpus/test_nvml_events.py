"""NVML's Xid events over a stand-in library, and the merge that keeps one record per fault."""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import anyio
import pynvml
import pytest

from supervisor.faults.classifier import Classifier, FaultClass
from supervisor.faults.merge import XidMerger, attributed_bus, feed, xid_key
from supervisor.faults.records import KernelLine
from supervisor.gpus.composite import CompositeBackend
from supervisor.gpus.nvml import NvmlBackend
from supervisor.gpus.nvml_events import xid_event_lines, xid_event_sources, xid_events, xid_line
from tests.gpus.test_nvml import FakeDevice, FakeNvml

WAIT_S = 20.0


class EventingNvml(FakeNvml):
    """The stand-in with an event set: `fire` queues an Xid as the driver would."""

    def __init__(self, devices: list[FakeDevice], unsupported: set[int] | None = None) -> None:
        super().__init__(devices)
        self.unsupported = unsupported or set()
        self.pending: list[Any] = []
        self.cond = threading.Condition()
        self.registered: list[FakeDevice] = []
        self.freed = False

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, _s: str) -> None:
        self.freed = True

    def nvmlDeviceRegisterEvents(self, d: FakeDevice, types: int, _s: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        if self.devices.index(d) in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(d)

    def nvmlEventSetWait_v2(self, _s: str, timeout_ms: int) -> Any:
        with self.cond:
            if not self.pending:
                self.cond.wait(timeout_ms / 1000)
            if not self.pending:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return self.pending.pop(0)

    def fire(self, d: FakeDevice, xid: int, instance: int = 0xFFFFFFFF) -> None:
        event = SimpleNamespace(
            device=d,
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=instance,
        )
        with self.cond:
            self.pending.append(event)
            self.cond.notify()


def cards() -> list[FakeDevice]:
    return [
        FakeDevice("00000000:01:00.0", "NVIDIA H100", 81559),
        FakeDevice("00000000:41:00.0", "NVIDIA H100", 81559),
    ]


def test_an_event_reads_like_the_kernels_xid_line() -> None:
    line = xid_line("0000:41:00.0", 79)
    assert line.startswith("NVRM: Xid (PCI:0000:41:00): 79,")
    cls = Classifier().feed(line)
    assert (cls.fault_class, cls.xid, cls.pci_bus_id) == (FaultClass.GPU_LOST, 79, "0000:41:00.0")
    assert "GPU-I:03" in xid_line("0000:41:00.0", 43, 3)


def test_events_of_every_card_that_supports_them() -> None:
    fake = EventingNvml(cards(), unsupported={0})
    backend = NvmlBackend(fake)
    backend.discover()
    (events,) = xid_event_sources(CompositeBackend([backend]))
    got: list[str] = []

    def emit(text: str) -> None:
        got.append(text)
        events.stop.set()

    fake.fire(fake.devices[1], 48)
    thread = threading.Thread(target=events.run, args=(emit,), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive() and fake.freed
    assert events.registered == 1 and fake.registered == [fake.devices[1]]
    assert got == [xid_line("0000:41:00.0", 48)]


async def test_event_lines_arrive_on_the_loop_and_stop_with_it() -> None:
    fake = EventingNvml(cards())
    backend = NvmlBackend(fake)
    backend.discover()
    events = xid_events(backend)
    lines = xid_event_lines(events)
    fake.fire(fake.devices[0], 79)
    with anyio.fail_after(WAIT_S):
        line = await lines.__anext__()
    assert line.text == xid_line("0000:01:00.0", 79)
    await lines.aclose()
    assert events.stop.is_set()


def test_xid_key_reads_both_bus_spellings() -> None:
    assert xid_key("NVRM: Xid (PCI:0000:01:00): 79, pid=1") == ("0000:01:00", 79)
    assert xid_key("NVRM: Xid (PCI:00000000:01:00.0): 79, x") == ("0000:01:00", 79)
    assert xid_key("NVRM: Xid (PCI:0000:01:00 GPU-I:02): 43, pid=9") == ("0000:01:00", 43)
    assert xid_key("amdgpu: ring gfx timeout") is None


def test_one_fault_reported_by_both_sources_is_one_record() -> None:
    m = XidMerger(window_s=10)
    kernel = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus."
    assert m.admit(kernel, "kernel", 0.0)
    assert not m.admit(xid_line("0000:01:00.0", 79), "nvml", 0.5)
    # The same source repeating is a new fault; so is a match outside the window.
    assert m.admit(kernel, "kernel", 1.0)
    assert m.admit(xid_line("0000:01:00.0", 79), "nvml", 30.0)
    assert m.admit(xid_line("0000:41:00.0", 79), "kernel", 30.1)
    assert m.admit("amdgpu: anything", "kernel", 30.2)


async def test_feed_merges_sources() -> None:
    async def source(*texts: str) -> AsyncGenerator[KernelLine, None]:
        for text in texts:
            yield KernelLine(text, 0.0)
            await anyio.sleep(0)

    got: list[str] = []
    kernel = "NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception"
    with anyio.fail_after(WAIT_S):
        await feed(
            {"kernel": source(kernel, "other"), "nvml": source(xid_line("0000:01:00.0", 13))},
            lambda line: got.append(line.text),
        )
    assert len(got) == 2 and "other" in got  # one of the two Xid reports, whichever came first
    assert [xid_key(t) for t in got if t != "other"] == [("0000:01:00", 13)]


@pytest.mark.parametrize("unsupported", [{0, 1}])
def test_no_card_registered_returns_at_once(unsupported: set[int]) -> None:
    fake = EventingNvml(cards(), unsupported=unsupported)
    backend = NvmlBackend(fake)
    backend.discover()
    events = xid_events(backend)
    events.run(lambda text: None)
    assert events.registered == 0 and fake.freed


def test_a_line_is_attributed_by_its_text_then_by_its_device() -> None:
    assert attributed_bus("0000:01:00.0", "0000:41:00.0") == "0000:01:00.0"
    assert attributed_bus(None, "0000:41:00.0") == "0000:41:00.0"
    assert attributed_bus(None, None) is None
