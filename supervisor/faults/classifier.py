"""Kernel-log line classification: which GPU, which vendor, and what kind of fault, if any.

Pure and stdlib-only. A line may carry any of the prefixes that logs add (dmesg stamps,
syslog and journal headers, `grep` file names, `/dev/kmsg` framing); the vendor rules live in
`supervisor.faults.nvidia` and `supervisor.faults.amd`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from supervisor.faults import amd, nvidia, pcicore

Vendor = Literal["nvidia", "amd"]


class FaultClass(StrEnum):
    GPU_HANG = "gpu_hang"  # hung or reset: fail the work, retry it, keep the card
    GPU_LOST = "gpu_lost"  # gone or unusable until reboot / operator reset
    APP_FAULT = "app_fault"  # one process's fault; the card stays usable
    BENIGN = "benign"


@dataclass(frozen=True)
class Classification:
    line: str
    vendor: Vendor | None
    fault_class: FaultClass
    pci_bus_id: str | None
    xid: int | None
    # The MIG GPU instance an Xid names (`Xid (PCI:0000:01:00 GPU-I:05): 31`): the fault is
    # that instance's, on the card of pci_bus_id. The raw line keeps the text as well.
    gpu_instance: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The object `gpusv classify-kernel-log --json` prints for one line."""
        out: dict[str, Any] = {
            "line": self.line,
            "vendor": self.vendor,
            "class": self.fault_class.value,
            "pci_bus_id": self.pci_bus_id,
            "xid": self.xid,
        }
        if self.gpu_instance is not None:
            out["gpu_instance"] = self.gpu_instance
        return out


# Applied repeatedly at the start of a line until none matches, so that stacked prefixes
# (`/var/log/syslog:` + syslog header + dmesg stamp) all come off.
_PREFIXES = tuple(
    re.compile(p)
    for p in (
        r"^\d+,\d+,\d+,[^;]*;",  # /dev/kmsg: prio,seq,usec,flags;
        r"^<\d{1,3}>",  # syslog priority
        r"^(?:/[^\s:]*|(?:kern\.log|syslog|messages|dmesg|journal)[\w.-]*):(?:\d+:)?",  # grep -H
        # rsyslog / journalctl -o short-iso / dmesg --time-format iso
        r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+"
        r"(?:\S+\s+kernel:\s*)?",
        # syslog "Mon DD hh:mm:ss [host] kernel:", any month language
        r"^\S{2,12}\s+\d{1,2}\s+\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\s+(?:\S+\s+)?kernel:\s*",
        r"^\[[^\]\[]*\d{1,2}:\d{2}:\d{2}[^\]\[]*\]\s*",  # dmesg -T
        r"^\[\s*\d+\.\d+\]\s*",  # dmesg
        r"^(?:\S+\s+)?kernel:\s*",  # journalctl -o short-monotonic, bare "kernel:"
        r"^(?:kern|user|daemon|syslog)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)"
        r"\s*:\s*",  # dmesg -x
    )
)
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")  # /dev/kmsg escapes newlines and other controls


def message_of(line: str) -> str:
    """The kernel message proper: `line` without log prefixes and kmsg escapes."""
    text = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), line).strip()
    for _ in range(8):
        before = text
        for prefix in _PREFIXES:
            text = prefix.sub("", text, count=1).lstrip()
        if text == before:
            break
    return text


_FULL_BDF = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?", re.I)
_LEGACY_BUS = re.compile(r"([0-9a-f]{4}):([0-9a-f]{2})", re.I)  # old `Xid (0003:00)`
_GPU_ID = re.compile(r"\[?\s*GPU ID\s+0x([0-9a-f]{1,8})\s*\]?", re.I)  # nvidia-drm
# NVIDIA/open-gpu-kernel-modules kernel_rc.c prints "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u"
# when a MIG compute instance is known, "... GPU-I:%02u" when only the GPU instance is.
_MIG_SUFFIX = re.compile(r"\s+GPU-I:\s*\w+(?:\s+GPU-CI:\s*\w+)?$", re.I)
_MIG_INSTANCE = re.compile(r"\bXid\s*\([^)]*\bGPU-I:\s*(\d+)(?:\s+GPU-CI:\s*\d+)?\)", re.I)


def normalize_bus_id(text: str) -> str | None:
    """`dddd:bb:dd.f` (lower case) for a bus id in any of the forms the drivers print.

    "PCI:0000:01:00", "0000:01:00.0", "00000000:01:00.0", "0001:6c:00", legacy "0003:00"
    (bus:device) and nvidia-drm "[GPU ID 0x00008800]" (domain<<16 | bus<<8 | device).
    """
    t = text.strip()
    m = _GPU_ID.fullmatch(t)
    if m is not None:
        gpu_id = int(m.group(1), 16)
        return _format(gpu_id >> 16, (gpu_id >> 8) & 0xFF, gpu_id & 0xFF, 0)
    t = _MIG_SUFFIX.sub("", t.strip("()[] "))
    t = re.sub(r"^PCI:\s*", "", t, flags=re.I)
    m = _FULL_BDF.fullmatch(t)
    if m is not None:
        return _format(
            int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4) or 0)
        )
    m = _LEGACY_BUS.fullmatch(t)
    if m is not None:
        return _format(0, int(m.group(1), 16), int(m.group(2), 16), 0)
    return None


def _format(domain: int, bus: int, device: int, function: int) -> str | None:
    if bus > 0xFF or device > 0x1F or function > 7:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


_PCI_TAG = re.compile(r"\bPCI:([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)(?!\w)", re.I)
# A bare id needs its function digit; the look-arounds keep sysfs paths and times out.
_BDF_IN_TEXT = re.compile(r"(?<![\w:/.])([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?!\w)", re.I)
_GPU_ID_IN_TEXT = re.compile(r"\[GPU ID 0x[0-9a-f]{1,8}\]", re.I)


def _find_bus_id(message: str) -> str | None:
    # The reporting GPU comes first: the Xid tag or the device prefix, before any peer.
    xid = nvidia.match_xid(message)
    if xid is not None:
        return normalize_bus_id(xid[0])
    for pattern in (_PCI_TAG, _BDF_IN_TEXT, _GPU_ID_IN_TEXT):
        m = pattern.search(message)
        if m is not None:
            return normalize_bus_id(m.group(m.lastindex or 0))
    return None


_NVRM = re.compile(r"\bNVRM\b")
# amdgpu's IP-block function names (FreeBSD prints them as "[drm ERROR :mes_v11_0_...]").
_AMD = re.compile(
    r"amdgpu|\bkfd\b|\bradeon\b|\[(?:gfx|mm)hub\d*\]|UTCL2|VRAM is lost"
    r"|\b(?:mes|gfx|sdma|psp|gmc|smu|vcn)_v\d+_\d",
    re.I,
)
# amdgpu's PSP functions in "[drm:psp_sw_init] *ERROR* ..." (FreeBSD: "[drm ERROR :psp_...]").
_AMD_PSP = re.compile(r"\[drm(?::|\s+ERROR\s+:)psp_")
# GSP firmware reports that the driver prints without its NVRM prefix.
_NVIDIA = re.compile(r"nvidia|\bGSP task (?:watchdog|panic|exception)|GSP-CrashCat", re.I)
# Plain "[drm]" lines that only the AMD driver prints.
_AMD_DRM = re.compile(
    r"^\[drm\].*(?:\b(?:PSP|SMU|VCN|UVD|VCE|SDMA|KIQ|MES|DMUB|DCN|GART|IBs|JPEG|PTB)\b"
    r"|\b(?:sdma|gfx_|comp_|kiq_|vcn_)\d|Display Core)",
    re.I,
)


def _vendor(message: str) -> Vendor | None:
    if _NVRM.search(message):
        return "nvidia"
    if _AMD.search(message):
        return "amd"
    if _NVIDIA.search(message):
        return "nvidia"
    if _AMD_DRM.search(message) or ("psp_" in message and _AMD_PSP.search(message)):
        return "amd"
    return None


def classify(line: str, *, previous: Classification | None = None) -> Classification:
    """Classify one kernel-log line.

    `previous` is the classification of the GPU line before it in the same log: an amdgpu
    process or page-fault detail line takes the class of the header it follows.
    """
    message = message_of(line)
    vendor = _vendor(message)
    if vendor is None:
        return Classification(line, None, FaultClass.BENIGN, None, None)
    bus_id = _find_bus_id(message)
    xid: int | None = None
    if pcicore.lost(message):
        verdict: nvidia.Verdict = nvidia.LOST
    elif vendor == "nvidia":
        verdict, xid = nvidia.classify(message)
        if verdict == "benign" and nvidia.CONTINUATION.match(message):
            verdict = _nvidia_context(previous) or verdict
    else:
        verdict = amd.classify(message, context=_amd_context(previous, bus_id))
    instance = _MIG_INSTANCE.search(message) if xid is not None else None
    gpu_instance = int(instance.group(1)) if instance else None
    return Classification(line, vendor, FaultClass(verdict), bus_id, xid, gpu_instance)


def _nvidia_context(previous: Classification | None) -> nvidia.Verdict | None:
    """An indented NVRM line continues the report before it (a GSP crash dump, the RPC
    history of a timeout) and takes its class."""
    if previous is None or previous.vendor != "nvidia":
        return None
    if previous.fault_class is FaultClass.GPU_HANG:
        return nvidia.HANG
    if previous.fault_class is FaultClass.GPU_LOST:
        return nvidia.LOST
    return None


def _amd_context(previous: Classification | None, bus_id: str | None) -> amd.Verdict | None:
    if previous is None or previous.vendor != "amd":
        return None
    if bus_id is not None and previous.pci_bus_id not in (None, bus_id):
        return None
    cls = previous.fault_class
    if cls is FaultClass.GPU_HANG:
        return amd.HANG
    if cls is FaultClass.APP_FAULT:
        return amd.APP
    return None


class Classifier:
    """Classifies the lines of one log in order, carrying the context that AMD details need."""

    def __init__(self) -> None:
        self._previous: Classification | None = None

    def feed(self, line: str) -> Classification:
        result = classify(line, previous=self._previous)
        # Unrelated kernel lines interleave with a GPU report; they do not break it.
        if result.vendor is not None:
            self._previous = result
        return result
