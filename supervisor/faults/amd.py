"""What amdgpu (and radeon) kernel messages mean for the work on the GPU.

The wordings come from the format strings in drivers/gpu/drm/amd/amdgpu (amdgpu_job.c,
amdgpu_device.c, amdgpu.h, amdgpu_gmc.c, gmc_v*.c, mes_v11_0.c, mes_v12_0.c), amdkfd and
pm/swsmu/smu_cmn.c. Pure and stdlib-only.
"""

from __future__ import annotations

import re
from typing import Literal

Verdict = Literal["gpu_hang", "gpu_lost", "app_fault", "benign"]
HANG: Verdict = "gpu_hang"
LOST: Verdict = "gpu_lost"
APP: Verdict = "app_fault"
BENIGN: Verdict = "benign"


def _any(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(patterns), re.I)


# Recovery failed or the device is gone: nothing runs on it until a reboot or operator reset.
_LOST = _any(
    r"GPU reset(?:\(\d+\))? failed",
    r"GPU Recovery Failed",
    r"GPU recovery disabled",
    r"device lost from bus",
    r"device wedged, needs recovery",
    r"device unplugged",
    r"\b(?:resume|hw_init|sw_init|late_init) of IP block <[^>]*> failed",
    r"amdgpu_device_ip_(?:init|resume) failed",
    r"Fatal error during GPU init",
    r"\bprobe of \S+ failed",
    r"ASIC reset failed",
    r"\b(?:mode ?[012]|BACO) reset failed",
    r"Emergency reboot",
    # A card that fails to come up: its firmware cannot be found or started. amdgpu_psp.c
    # (psp_sw_init "Failed to load psp firmware!", psp_init_toc_microcode "fail to
    # request/validate toc microcode", psp_hw_start "PSP create ring failed!" / "PSP load %s
    # failed!", psp_hw_init / psp_load_fw "PSP firmware loading failed", psp_resume "PSP
    # resume failed", psp_get_fw_type "Unknown firmware type"), amdgpu_device.c
    # amdgpu_device_parse_gpu_info_fw "Failed to load gpu_info firmware", pm/swsmu
    # smu_start_smc_engine "SMC engine is not correctly up!", powerplay pp_dpm_load_fw "fw
    # load failed". Firmware amdgpu asks for is required (optional blobs are requested
    # without a warning), so the firmware loader's own "Direct firmware load for amdgpu/...
    # failed" (FreeBSD: "could not load firmware image 'amdgpu/...'") is the same failure.
    r"\bPSP (?:create ring|resume|firmware loading|load \w+|tmr init|hw init)\w* failed",
    r"Failed to load psp firmware|fail to request/validate \w+ microcode",
    r"Unknown firmware type|Failed to load gpu_info firmware",
    r"Direct firmware load for amdgpu/\S+ failed|could not load firmware image 'amdgpu/",
    r"SMC engine is not correctly up|\bSMC is not ready|\bfw load failed",
)
# Every pattern of _LOST holds one of these words (lower case). Most amdgpu lines hold none,
# and testing for them costs far less than the search, which every amdgpu line would pay.
_LOST_WORDS = (
    "fail",
    "disabled",
    "lost from bus",
    "wedged",
    "unplugged",
    "fatal error",
    "emergency",
    "unknown firmware",
    "could not load",
    "smc",
)
_RESET_END = re.compile(r"GPU reset end with ret = (-?\d+)", re.I)

# A ring, queue or the whole GPU hung or was reset; the work in flight on it is lost.
_HANG = _any(
    r"amdgpu_job_timedout",
    r"Process information:",
    r"\bring \S+ timeout",
    r"\bring \S+ reset\b|\bring reset\b",
    r"test failed|IB test timed out",
    r"\bGPU reset\b",
    r"\b(?:mode ?[012]|BACO|PCI CONFIG|link) reset\b",
    r"VRAM is lost",
    r"Guilty job",
    r"Bailing on TDR",
    r"device wedged",
    r"coredump",
    r"Dumping IP State",
    r"\bis hung\b",
    r"recover vram bo from shadow",
    r"Skip scheduling IBs|Error scheduling IBs|couldn't schedule ib",
    r"MES(?:\(\d+\))? failed to respon",
    r"MES might be in unrecoverable state",
    r"hardware queue (?:from|to) MES",
    r"failed to (?:unmap|map|reset|remove|add) (?:legacy |kernel |hardware )?queue",
    r"MES ring buffer is full",
    r"failed to (?:suspend|resume) (?:all )?gangs",
    r"qcm fence wait loop timeout",
    r"failed to halt cp",
    r"\bK[CGI]Q (?:enable|disable) failed|KIQ dequeue",
    r"Failed to (?:suspend|evict|restore|quiesce|resume|remove|destroy|preempt)\b"
    r"[^,]*\b(?:process|queues?|KFD|pasid)",
    r"preemption (?:time ?out|failed)|unsuccessful queues? preemption",
    r"destroy queue \d+ failed",
    r"cp might be in an unrecoverable state",
    r"Resetting wave fronts",
    r"failed to (?:write|read) reg",
    r"wait(?:ing)? for kiq fence",
    r"Failed to detect and reset",
    r"suspend of IP block <[^>]*> failed",
    r"SMU: I'm not done with your previous command|SMU: response:0x",
    r"Msg issuing pre-check failed|SMU may be not in the right state",
    r"failed to send message \w+ ret is|last message was failed",  # powerplay: SMU gone quiet
    r"Poison (?:is )?consum|ERREVENT_|\[Hardware Error\]",
    r"GPU lockup|stalled for more than|GPU softreset",
    # PSP (the security processor that loads firmware and resets the GPU) failing on a
    # running card; its failures to come up are in _LOST.
    r"\bPSP (?:ring (?:stop|destroy)|reset|suspend)\w* failed",
    # psp_cmd_submit_buf() only warns when a command answers with an error status: a
    # trusted application or one IP's firmware that does not load leaves the card running
    # (a load that matters fails the init with a message of its own, in _LOST).
    r"psp gfx command (?!LOAD_TA|INVOKE_CMD|LOAD_IP_FW)\w+\(0x[0-9a-f]+\) failed",
    r"failed to (?:load|start|stop|terminate) (?:psp|the psp)",
    # MES queue and pipe resets, and the register waits MES runs for the driver.
    r"reset via MES failed|\breset (?:compute|gfx|sdma) queue\b",
    r"reg_write_reg_wait|(?:Suspending|Resuming) all queues failed",
    r"\bcp is busy\b",
    # The SMU (power management firmware) no longer answering.
    r"failed (?:to )?send (?:pre )?message|SMU: No response|SMU is not responding",
    r"Failed to (?:export SMU metrics table|disable smu features|get current clock freq)",
    r"Fail(?:ed)? to disable dpm features",
    r"\btry pipe reset\b|\bpipe reset (?:failed|begin|succeeded)",
)
_UNCORRECTABLE = re.compile(r"(?:(\d+) )?uncorrectable hardware error", re.I)

# A command submission of one process was refused (its context is guilty or was lost).
_APP = _any(r"Failed to initialize parser")

_FAULT_HEADER = _any(r"page fault", r"\bVM fault\b", r"GPU fault detected", r"\[sdma\d+\] address:")
_VMID = re.compile(r"\bvmid[: ]\s*(\d+)", re.I)
_PASID = re.compile(r"\bpasid[: ]\s*(\d+)", re.I)

# Lines printed after a ring-timeout or page-fault header, about the same event.
_DETAIL = re.compile(
    r"\b(?:Process|in process|for process)\s+\S*\s*pid \d+"
    r"|in page starting at address"
    r"|_PROTECTION_FAULT_(?:STATUS|ADDR)"
    r"|Faulty UTCL2 client"
    r"|\b(?:MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW):"
    r"|cookie node_id|fault from die"
)


def classify(message: str, *, context: Verdict | None = None) -> Verdict:
    """The verdict for an amdgpu message (prefix stripped).

    `context` is the verdict of the fault header this line may follow: process and detail
    lines take it, or app_fault without one (most such lines belong to page faults).
    """
    lower = message.lower()
    if any(word in lower for word in _LOST_WORDS) and _LOST.search(message):
        return LOST
    end = _RESET_END.search(message)
    if end is not None:
        return LOST if int(end.group(1)) != 0 else HANG
    fault = _page_fault(message)
    if fault is not None:
        return fault
    if _HANG.search(message) or _uncorrectable(message):
        return HANG
    if _APP.search(message):
        return APP
    if _DETAIL.search(message):
        return context if context in (HANG, APP) else APP
    return BENIGN


def _page_fault(message: str) -> Verdict | None:
    # A fault in a process's VM (vmid and pasid set) is that process's bug; one in the
    # kernel's VM (vmid 0) or without a process (pasid 0) means the GPU itself went astray.
    if _FAULT_HEADER.search(message) is None:
        return None
    vmid = _VMID.search(message)
    if vmid is None:
        return APP
    pasid = _PASID.search(message)
    if int(vmid.group(1)) == 0 or (pasid is not None and int(pasid.group(1)) == 0):
        return HANG
    return APP


def _uncorrectable(message: str) -> bool:
    m = _UNCORRECTABLE.search(message)
    return m is not None and (m.group(1) is None or int(m.group(1)) > 0)
