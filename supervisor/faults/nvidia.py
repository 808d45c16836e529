"""What NVIDIA driver messages mean: the Xid catalog and the NVRM lines of a lost or hung GPU.

Pure and stdlib-only; `supervisor.faults.classifier` turns the verdicts into `FaultClass`.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from supervisor.faults import recovery

Verdict = Literal["gpu_hang", "gpu_lost", "app_fault", "benign"]
HANG: Verdict = "gpu_hang"
LOST: Verdict = "gpu_lost"
APP: Verdict = "app_fault"
BENIGN: Verdict = "benign"


class XidEntry(NamedTuple):
    mnemonic: str
    verdict: Verdict


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), keyed
# by Xid. The verdict follows the catalog's immediate action: RESTART_APP -> app_fault,
# RESET_GPU -> gpu_hang, RESTART_BM / reboot / init failure -> gpu_lost, IGNORE -> benign,
# with the exceptions commented. Codes the catalog calls "Unused" on Ampere and later keep the
# meaning the older (Volta) catalog gave them, since older cards still report them.
XID_CATALOG: dict[int, XidEntry] = {
    1: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", APP),
    2: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", APP),
    3: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", APP),
    4: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", APP),
    5: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", APP),
    6: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", APP),
    7: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", APP),
    # Catalog: RESTART_APP. "GPU stopped processing": the engine is stuck, so a hang.
    8: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", HANG),
    # Volta catalog: driver error programming the GPU / handling an exception (gpud: reboot).
    9: XidEntry("ROBUST_CHANNEL_GR_ERROR_INSTANCE", HANG),
    10: XidEntry("ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", APP),
    11: XidEntry("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", APP),
    12: XidEntry("ROBUST_CHANNEL_GR_ERROR_SW_METHOD", HANG),
    13: XidEntry("ROBUST_CHANNEL_GR_EXCEPTION", APP),
    14: XidEntry("ROBUST_CHANNEL_FAKE_ERROR", BENIGN),
    15: XidEntry("ROBUST_CHANNEL_SCANLINE_TIMEOUT", BENIGN),
    # Volta catalog: display engine hung. Display only; compute work is unaffected.
    16: XidEntry("ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", BENIGN),
    17: XidEntry("ROBUST_CHANNEL_PARAMETER_ERROR", APP),
    # Volta catalog: bus mastering disabled in PCI config space; the GPU cannot DMA.
    18: XidEntry("ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", LOST),
    19: XidEntry("ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", BENIGN),
    20: XidEntry("ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", APP),
    21: XidEntry("ROBUST_CHANNEL_ME_ERROR_SW_METHOD", APP),
    22: XidEntry("ROBUST_CHANNEL_VP_ERROR_SW_METHOD", APP),
    23: XidEntry("ROBUST_CHANNEL_RC_LOGGING_ENABLED", BENIGN),
    # Volta catalog: GPU semaphore timeout.
    24: XidEntry("ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", HANG),
    25: XidEntry("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", APP),
    # Volta catalog: framebuffer timeout.
    26: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", HANG),
    27: XidEntry("ROBUST_CHANNEL_VP_ERROR", APP),
    28: XidEntry("ROBUST_CHANNEL_VP2_ERROR", APP),
    29: XidEntry("ROBUST_CHANNEL_BSP_ERROR", APP),
    30: XidEntry("ROBUST_CHANNEL_BAD_ADDR_ACCESS", APP),
    31: XidEntry("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", APP),
    32: XidEntry("ROBUST_CHANNEL_PBDMA_ERROR", APP),
    # Volta catalog: internal micro-controller error.
    33: XidEntry("ROBUST_CHANNEL_SEC_ERROR", HANG),
    34: XidEntry("ROBUST_CHANNEL_MSVLD_ERROR", APP),
    35: XidEntry("ROBUST_CHANNEL_MSPDEC_ERROR", APP),
    36: XidEntry("ROBUST_CHANNEL_MSPPP_ERROR", APP),
    # Catalog: IGNORE, investigate CHECK_APP/CUDA; the offending channel is torn down.
    37: XidEntry("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", APP),
    # Catalog: IGNORE. A context-switch firmware watchdog fired: the work on the GPU is lost,
    # so the job is retried as a hang.
    38: XidEntry("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", HANG),
    39: XidEntry("ROBUST_CHANNEL_CE0_ERROR", APP),
    40: XidEntry("ROBUST_CHANNEL_CE1_ERROR", APP),
    41: XidEntry("ROBUST_CHANNEL_CE2_ERROR", APP),
    42: XidEntry("ROBUST_CHANNEL_VIC_ERROR", APP),
    # Catalog: IGNORE. k8s-device-plugin lists it among application errors (GPU healthy).
    43: XidEntry("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", APP),
    # Catalog: IGNORE; gpud and NVSentinel only monitor it. It follows a channel's own fault.
    44: XidEntry("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", APP),
    # Catalog: WORKFLOW_XID_45. Application error even when it names a hardware root cause:
    # that cause is reported by its own Xid.
    45: XidEntry("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", APP),
    46: XidEntry("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", HANG),
    47: XidEntry("ROBUST_CHANNEL_NVENC0_ERROR", APP),
    48: XidEntry("ROBUST_CHANNEL_GPU_ECC_DBE", HANG),
    49: XidEntry("SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", BENIGN),
    50: XidEntry("SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", BENIGN),
    51: XidEntry("SILENT_RUNNING_STRESS_TEST_FAILURE", BENIGN),
    52: XidEntry("SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", BENIGN),
    53: XidEntry("SILENT_RUNNING_TEMP_REDUCED_CLOCKING", BENIGN),
    # Catalog: CHECK_MECHANICALS. The card runs at reduced clocks; no work is lost.
    54: XidEntry("SILENT_RUNNING_PWR_REDUCED_CLOCKING", BENIGN),
    55: XidEntry("SILENT_RUNNING_TEMPERATURE_READ_ERROR", BENIGN),
    56: XidEntry("DISPLAY_CHANNEL_EXCEPTION", BENIGN),
    # Volta catalog: error programming / unstable video memory interface.
    57: XidEntry("FB_LINK_TRAINING_FAILURE_ERROR", HANG),
    58: XidEntry("FB_MEMORY_ERROR", HANG),
    59: XidEntry("PMU_ERROR", HANG),
    60: XidEntry("ROBUST_CHANNEL_SEC2_ERROR", APP),
    61: XidEntry("PMU_BREAKPOINT", HANG),
    62: XidEntry("PMU_HALT_ERROR", HANG),
    63: XidEntry("INFOROM_DRAM_RETIREMENT_EVENT", BENIGN),
    # Catalog: RESET_GPU. A failed row remap is an RMA criterion: take the card out of service.
    64: XidEntry("INFOROM_DRAM_RETIREMENT_FAILURE", LOST),
    65: XidEntry("ROBUST_CHANNEL_NVENC1_ERROR", APP),
    66: XidEntry("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", BENIGN),
    67: XidEntry("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", BENIGN),
    68: XidEntry("ROBUST_CHANNEL_NVDEC0_ERROR", APP),
    69: XidEntry("ROBUST_CHANNEL_GR_CLASS_ERROR", APP),
    70: XidEntry("ROBUST_CHANNEL_CE3_ERROR", APP),
    71: XidEntry("ROBUST_CHANNEL_CE4_ERROR", APP),
    72: XidEntry("ROBUST_CHANNEL_CE5_ERROR", APP),
    73: XidEntry("ROBUST_CHANNEL_NVENC2_ERROR", APP),
    # Catalog: WORKFLOW_NVLINK_ERR. Collective jobs on the link die with it.
    74: XidEntry("NVLINK_ERROR", HANG),
    75: XidEntry("ROBUST_CHANNEL_CE6_ERROR", APP),
    76: XidEntry("ROBUST_CHANNEL_CE7_ERROR", APP),
    77: XidEntry("ROBUST_CHANNEL_CE8_ERROR", APP),
    78: XidEntry("VGPU_START_ERROR", LOST),
    79: XidEntry("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", LOST),
    80: XidEntry("PBDMA_PUSHBUFFER_CRC_MISMATCH", APP),
    81: XidEntry("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", BENIGN),
    82: XidEntry("ROBUST_CHANNEL_NVJPG0_ERROR", APP),
    83: XidEntry("ROBUST_CHANNEL_NVDEC1_ERROR", APP),
    84: XidEntry("ROBUST_CHANNEL_NVDEC2_ERROR", APP),
    85: XidEntry("ROBUST_CHANNEL_CE9_ERROR", APP),
    86: XidEntry("ROBUST_CHANNEL_OFA0_ERROR", APP),
    87: XidEntry("NVTELEMETRY_DRIVER_REPORT", BENIGN),
    88: XidEntry("ROBUST_CHANNEL_NVDEC3_ERROR", APP),
    89: XidEntry("ROBUST_CHANNEL_NVDEC4_ERROR", APP),
    # Unused on Ampere+; an L2 cache error on older cards.
    90: XidEntry("LTC_ERROR", HANG),
    91: XidEntry("RESERVED_XID", APP),
    92: XidEntry("EXCESSIVE_SBE_INTERRUPTS", BENIGN),
    93: XidEntry("INFOROM_ERASE_LIMIT_EXCEEDED", BENIGN),
    # Catalog: RESTART_APP (the GPU stays healthy), but the work on it is lost to a memory
    # error rather than to a bug of the job, so it is retried with the hang budget.
    94: XidEntry("ROBUST_CHANNEL_CONTAINED_ERROR", HANG),
    95: XidEntry("ROBUST_CHANNEL_UNCONTAINED_ERROR", HANG),
    96: XidEntry("ROBUST_CHANNEL_NVDEC5_ERROR", APP),
    97: XidEntry("ROBUST_CHANNEL_NVDEC6_ERROR", APP),
    98: XidEntry("ROBUST_CHANNEL_NVDEC7_ERROR", APP),
    99: XidEntry("ROBUST_CHANNEL_NVJPG1_ERROR", APP),
    100: XidEntry("ROBUST_CHANNEL_NVJPG2_ERROR", APP),
    101: XidEntry("ROBUST_CHANNEL_NVJPG3_ERROR", APP),
    102: XidEntry("ROBUST_CHANNEL_NVJPG4_ERROR", APP),
    103: XidEntry("ROBUST_CHANNEL_NVJPG5_ERROR", APP),
    104: XidEntry("ROBUST_CHANNEL_NVJPG6_ERROR", APP),
    105: XidEntry("ROBUST_CHANNEL_NVJPG7_ERROR", APP),
    106: XidEntry("SMBPBI_TEST_MESSAGE", BENIGN),
    107: XidEntry("SMBPBI_TEST_MESSAGE_SILENT", BENIGN),
    108: XidEntry("NVLINK_REMOTE_TRANSLATION_ERROR", BENIGN),
    109: XidEntry("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", HANG),
    110: XidEntry("SEC_FAULT_ERROR", HANG),
    111: XidEntry("BUNDLE_ERROR_EVENT", APP),
    112: XidEntry("DISP_SUPERVISOR_ERROR", BENIGN),
    113: XidEntry("DP_LT_FAILURE", BENIGN),
    114: XidEntry("HEAD_RG_UNDERFLOW", BENIGN),
    115: XidEntry("CORE_CHANNEL_REGS", BENIGN),
    116: XidEntry("WINDOW_CHANNEL_REGS", BENIGN),
    117: XidEntry("CURSOR_CHANNEL_REGS", BENIGN),
    118: XidEntry("HEAD_REGS", BENIGN),
    119: XidEntry("GSP_RPC_TIMEOUT", HANG),
    120: XidEntry("GSP_ERROR", HANG),
    121: XidEntry("C2C_ERROR", BENIGN),
    # InfoROM/SPI flash accesses through the PMU: no work in flight is lost.
    122: XidEntry("SPI_PMU_RPC_READ_FAIL", BENIGN),
    123: XidEntry("SPI_PMU_RPC_WRITE_FAIL", BENIGN),
    124: XidEntry("SPI_PMU_RPC_ERASE_FAIL", BENIGN),
    125: XidEntry("INFOROM_FS_ERROR", BENIGN),
    126: XidEntry("ROBUST_CHANNEL_CE10_ERROR", APP),
    127: XidEntry("ROBUST_CHANNEL_CE11_ERROR", APP),
    128: XidEntry("ROBUST_CHANNEL_CE12_ERROR", APP),
    129: XidEntry("ROBUST_CHANNEL_CE13_ERROR", APP),
    130: XidEntry("ROBUST_CHANNEL_CE14_ERROR", APP),
    131: XidEntry("ROBUST_CHANNEL_CE15_ERROR", APP),
    132: XidEntry("ROBUST_CHANNEL_CE16_ERROR", APP),
    133: XidEntry("ROBUST_CHANNEL_CE17_ERROR", APP),
    134: XidEntry("ROBUST_CHANNEL_CE18_ERROR", APP),
    135: XidEntry("ROBUST_CHANNEL_CE19_ERROR", APP),
    136: XidEntry("ALI_TRAINING_FAIL", HANG),
    137: XidEntry("NVLINK_PRIV_ERR", BENIGN),
    138: XidEntry("ROBUST_CHANNEL_DLA_ERROR", APP),
    139: XidEntry("ROBUST_CHANNEL_OFA1_ERROR", APP),
    140: XidEntry("UNRECOVERABLE_ECC_ERROR_ESCAPE", HANG),
    141: XidEntry("ROBUST_CHANNEL_FAST_PATH_ERROR", BENIGN),
    142: XidEntry("ROBUST_CHANNEL_NVENC3_ERROR", APP),
    143: XidEntry("GPU_INIT_ERROR", LOST),
    # 144-150: NVLink5; the line says Fatal or Nonfatal, see classify_xid.
    144: XidEntry("NVLINK_SAW_ERROR", HANG),
    145: XidEntry("NVLINK_RLW_ERROR", HANG),
    146: XidEntry("NVLINK_TLW_ERROR", HANG),
    147: XidEntry("NVLINK_TREX_ERROR", HANG),
    148: XidEntry("NVLINK_NVLPW_CTRL_ERROR", HANG),
    149: XidEntry("NVLINK_NETIR_ERROR", HANG),
    150: XidEntry("NVLINK_MSE_ERROR", HANG),
    151: XidEntry("ROBUST_CHANNEL_KEY_ROTATION_ERROR", LOST),
    152: XidEntry("ROBUST_CHANNEL_DLA_SMMU_ERROR", BENIGN),
    153: XidEntry("ROBUST_CHANNEL_DLA_TIMEOUT", BENIGN),
    # The verdict depends on the action the line names, see classify_xid.
    154: XidEntry("GPU_RECOVERY_ACTION_CHANGED", HANG),
    155: XidEntry("NVLINK_SW_DEFINED_ERROR", HANG),
    # Catalog: RESET_GPU, where the older equivalent (Xid 63) is IGNORE.
    156: XidEntry("RESOURCE_RETIREMENT_EVENT", HANG),
    157: XidEntry("RESOURCE_RETIREMENT_FAILURE", BENIGN),
    158: XidEntry("GPU_FATAL_TIMEOUT", HANG),
    159: XidEntry("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", APP),
    160: XidEntry("CHANNEL_RETIREMENT_EVENT", BENIGN),
    161: XidEntry("CHANNEL_RETIREMENT_FAILURE", BENIGN),
    162: XidEntry("PSHC_REENGAGED", BENIGN),
    163: XidEntry("PSHC_DISENGAGED", BENIGN),
    164: XidEntry("PSHC_LOW_LIFETIME", BENIGN),
    165: XidEntry("PSHC_ZERO_LIFETIME", BENIGN),
    166: XidEntry("NVLINK_SECURE_CRYPTO_ERR", HANG),
    167: XidEntry("PCIE_FATAL_TIMEOUT", HANG),
    168: XidEntry("REDUCED_GPU_MEMORY_CAPACITY", BENIGN),
    169: XidEntry("SEC2_HALT_ERROR", HANG),
    170: XidEntry("NVLINK_SECURE_OTHER", HANG),
    171: XidEntry("UNCORRECTABLE_DRAM_ERROR", HANG),
    172: XidEntry("UNCORRECTABLE_SRAM_ERROR", HANG),
}

# An Xid newer than this table: the driver tore down at least one channel. app_fault fails
# only the job that owned it, as an ordinary failure, and keeps the card in service; a real
# hang behind it still shows as a reset line or trips the no-progress watchdog.
UNKNOWN_XID: Verdict = APP

_XID = re.compile(r"\bXid\s*\(([^)]*)\):\s*(\d+)\b(.*)", re.S)
# "Nonfatal" and "Non-fatal" name the same events as harmless.
_FATAL = re.compile(r"(?<![-\w])fatal\b", re.I)
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.I)
_LOST = re.compile(
    "|".join(
        (
            r"fallen off the bus",
            r"GPU lost from the bus|NV_ERR_GPU_IS_LOST",
            r"RmInitAdapter failed|rm_init_adapter failed",
            r"Cannot attach gpu",
            r"probe routine (?:failed|was not called)",
            r"\bprobe of \S+ failed",
            r"None of the NVIDIA devices were initialized",
            r"No NVIDIA (?:GPUs?|devices?) (?:found|probed)",
            # GSP boot failures; the card stays unusable until it is reset.
            r"cannot proceed with booting GSP|Cannot initialize GSP|cannot bootstrap GSP",
            r"WPR2 already up|the GPU is likely in a bad state",
            r"GSP(?:-RM)? (?:init|boot)\w* (?:failed|failure|timed out)",
            r"failed to (?:boot|load|initiali[sz]e) GSP",
            r"failed to wait for GFW",
            r"does not have the necessary power cables",
            r"Failed to copy vbios",
            r"with non-zero usage count",
            r"PCI I/O region assigned to your NVIDIA device is invalid",
            # UVM gave up on the GPU: "... global fatal error 0x60, requiring os reboot".
            r"global fatal error|requiring os reboot",
            # The first lines of the multi-line "fallen off the bus" and "not supported"
            # messages, as dmesg splits them.
            r"The NVIDIA GPU [0-9a-f]{4,8}:",
            r"installed in this system (?:has\s*$|is\b)",
            r"requires use of the NVIDIA open kernel modules",
            # GSP RPCs that fail with NV_ERR_GPU_IS_LOST (0xf): the card is gone.
            r"status[ =:]*0x0*f\b",
            # The follow-ons of a failed boot (RmInitAdapter): the FSP/GSP never came up.
            r"kfspSendBootCommands|FSP command queue|kfspPollForQueueEmpty",
            r"Cannot initialize GSP|GSP (?:firmware )?(?:init|boot)\w* failed",
            r"API_GPU_ATTACHED_SANITY_CHECK failed",  # follows Xid 79: nothing is attached
            # GSP boot steps that fail (kernel_gsp*.c: kgspBootstrap_GH100 "GSP-FMC reported
            # an error while attempting to boot GSP", the FWSEC and Booter ucodes that set it
            # up), and a GSP that cannot be unloaded to suspend (gpu_pm "GSP unload failed at
            # suspend"): the card is unusable until reset.
            r"GSP-FMC reported an error|returned from kgsp(?:PrepareForBootstrap|Bootstrap)",
            r"failed to prepare interface data for FWSEC|Booter failed with non-zero error",
            r"GSP unload failed",
        )
    ),
    re.I | re.M,
)
# Every pattern of _LOST holds one of these words (lower case); testing for them first spares
# most NVRM lines the search.
_LOST_WORDS = (
    "fallen off",
    "lost",
    "fail",
    "cannot",
    "probe",
    "none of the",
    "no nvidia",
    "wpr2",
    "bad state",
    "gsp",
    "power cables",
    "non-zero usage",
    "i/o region",
    "fatal error",
    "os reboot",
    "the nvidia gpu",
    "installed in this system",
    "open kernel modules",
    "status",
    "fsp",
)
_HANG = re.compile(
    "|".join(
        (
            r"GPU is probably locked|\bRC watchdog\b",
            r"PMU has halted|PmuHalted",
            r"Rate limiting GSP RPC|likely needs to be reset",
            # kernel_gsp.c _kgspRpcRecvPoll after three RPC timeouts in a row: "Back to back
            # GSP RPC timeout detected! GPU marked for reset".
            r"GPU marked for reset",
            r"Timeout after \d+\s*s of waiting for RPC response",
            r"_kgspLogXid119|\bGSP Timeout\b",
            r"GSP(?:-RM)? (?:has )?crashed",
            r"GPU crash dump has been created",
            # GSP firmware: heartbeat lost, crash reports, task watchdog, RPC timeouts.
            r"heartbeat timed out|_kgspIsHeartbeatTimedOut",
            r"GSP-CrashCat Report|LibOS Task Watchdog Report",
            r"GSP task (?:watchdog timeout|panic|exception)",
            r"rpcRecvPoll timed ?out|RPC event history|RPC history \(CPU",
            r"NV_ERR_TIMEOUT|NVRM_RPC: .* failed with error 0x65\b",
            r"NV_ERR_RESET_REQUIRED",
            # A membar that never completes: the memory subsystem is stuck.
            r"kbusSendSysmembar\w*: .*timeout|Memory Subsystem Error",
            r"checking for memory subsystem error",
            # The diagnostics RM prints around a GSP timeout: falcon core dumps, RM's own
            # thread timeouts.
            r"kflcnCoreDump|_threadNodeCheckTimeout",
        )
    ),
    re.I,
)


def match_xid(message: str) -> tuple[str, int, str] | None:
    """(bus text inside the parentheses, Xid, the text after it) of an `NVRM: Xid` line."""
    m = _XID.search(message)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), m.group(3)


def classify_xid(xid: int, detail: str) -> Verdict:
    if xid == 154:
        return recovery.verdict(detail)
    if 144 <= xid <= 150 and _NONFATAL.search(detail) and not _FATAL.search(detail):
        return BENIGN
    entry = XID_CATALOG.get(xid)
    return entry.verdict if entry is not None else UNKNOWN_XID


_RC_ALL = re.compile(r"RC all channels for critical error (\d+)", re.I)
# The indented lines of a multi-line NVRM report (a GSP crash dump, an RPC history table).
CONTINUATION = re.compile(r"^NVRM:\s{2,}\S")


def classify(message: str) -> tuple[Verdict, int | None]:
    """The verdict for an NVIDIA message (prefix already stripped) and its Xid, if any."""
    xid = match_xid(message)
    if xid is not None:
        return classify_xid(xid[1], xid[2]), xid[1]
    rc_all = _RC_ALL.search(message)
    if rc_all is not None:  # the driver tore every channel down for that Xid: its verdict
        return classify_xid(int(rc_all.group(1)), ""), None
    lower = message.lower()
    if any(word in lower for word in _LOST_WORDS) and _LOST.search(message):
        return LOST, None
    if _HANG.search(message):
        return HANG, None
    return BENIGN, None
