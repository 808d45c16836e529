"""The families of kernel lines that tell a GPU's state, each with the reports or the driver
source its lines come from, and the benign lines that look like them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.classifier_score import DATA, read_rows
from supervisor.faults.classifier import Classifier, FaultClass, classify
from supervisor.faults.nvidia import classify_xid

HANG, LOST, APP, BENIGN = (
    FaultClass.GPU_HANG,
    FaultClass.GPU_LOST,
    FaultClass.APP_FAULT,
    FaultClass.BENIGN,
)


def _classes(*lines: str) -> list[FaultClass]:
    classifier = Classifier()
    return [classifier.feed(line).fault_class for line in lines]


# --- a card that fails to come up ------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        # https://github.com/ROCm/legacy-rocm-build/issues/2747 (MI210 x4, PSP ring creation)
        "[Mon Dec 18 08:34:36 2023] [drm:psp_hw_start [amdgpu]] *ERROR* PSP create ring failed!",
        # https://github.com/QubesOS/qubes-issues/issues/6923 (PSP resume)
        "Dec 04 00:58:22 dom0 kernel: [drm:psp_resume [amdgpu]] *ERROR* PSP resume failed",
        # https://github.com/kernelci/kernelci-core/pull/2238 (missing PSP firmware)
        "[    3.593924] [drm:psp_sw_init] *ERROR* Failed to load psp firmware!",
        "[    3.586367] amdgpu 0000:04:00.0: amdgpu: fail to request/validate toc microcode",
        "[    3.576634] amdgpu 0000:04:00.0: Direct firmware load for amdgpu/psp_13_0_8_toc.bin"
        " failed with error -2",
        # https://github.com/FreeBSDDesktop/kms-drm/issues/206 (PSP firmware loading, FreeBSD)
        "[drm ERROR :psp_hw_init] PSP firmware loading failed",
        # amdgpu_psp.c psp_hw_start: "PSP load %s failed!"; powerplay pp_dpm_load_fw
        "[drm:psp_hw_start [amdgpu]] *ERROR* PSP load kdb failed!",
        "amdgpu: fw load failed",
        # https://github.com/ROCm/amdgpu/issues/183 (MI100: the SMU does not start on resume)
        "[   33.871308] amdgpu 0000:03:00.0: amdgpu: SMC engine is not correctly up!",
        # https://github.com/NVIDIA/gpu-operator/issues/649 (RmInitAdapter)
        "[ 1097.650222] NVRM: GPU 0000:04:01.0: RmInitAdapter failed! (0x11:0x45:2525)",
        # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/943 (GSP bootstrap prep)
        "[   10.842114] NVRM: s_prepareForFwsec_TU102: failed to prepare interface data for"
        " FWSEC cmd 0x15: 0x25",
        # kernel_gsp_gh100.c kgspBootstrap_GH100, as quoted from open-gpu-kernel-modules #974
        "NVRM: kgspBootstrap_GH100: GSP-FMC reported an error while attempting to boot GSP:"
        " 0xffffffff",
        # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/673 (Booter)
        "NVRM s_executeBooterUcode_TU102: Booter failed with non-zero error code: 0xa",
    ],
)
def test_a_card_that_fails_to_come_up_is_lost(line: str) -> None:
    assert classify(line).fault_class is LOST


@pytest.mark.parametrize(
    "line",
    [
        # https://github.com/NixOS/nixpkgs/issues/419838: one IP's firmware is refused and
        # the card comes up (psp_cmd_submit_buf only warns on a response status)
        "[    2.585146] amdgpu 0000:03:00.0: amdgpu: psp gfx command LOAD_IP_FW(0x6) failed and"
        " response status is (0x11)",
        "[    2.585144] amdgpu 0000:03:00.0: amdgpu: failed to load ucode DMCUB(0x3D)",
        # https://github.com/freebsd/drm-kmod/issues/323: the loader tries path after path
        "amdgpu/navy_flounder_sos.bin: could not load binary firmware"
        " /boot/firmware/amdgpu/navy_flounder_sos.bin either",
        # firmware versions at boot: https://github.com/raspberrypi/linux/pull/7113,
        # https://github.com/ROCm/legacy-rocm-build/issues/2747
        "[    5.335904] amdgpu 0001:03:00.0: amdgpu: [VCN instance 0] Found VCN firmware"
        " Version ENC: 1.33 DEC: 4 VEP: 0 Revision: 3",
        "[Mon Dec 18 08:34:36 2023] amdgpu 0000:c7:00.0: amdgpu: Will use PSP to load VCN firmware",
        "[   33.723056] amdgpu 0000:03:00.0: amdgpu: PSP is resuming...",
        # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/531
        "[   62.083636] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19"
        " 18:56:32 UTC 2023",
    ],
)
def test_firmware_lines_of_a_card_that_comes_up_are_benign(line: str) -> None:
    assert classify(line).fault_class is BENIGN


# --- a card that does not come back from a power state ---------------------------------------


@pytest.mark.parametrize(
    ("line", "vendor", "bus_id"),
    [
        # https://github.com/minisforum-docs/MS-02-Ultra/issues/26 (W7900, runtime PM)
        ("amdgpu 0000:03:00.0: not ready 65535ms after resume; giving up", "amd", "0000:03:00.0"),
        ("amdgpu 0000:03:00.0: pci_channel_io_perm_failure: state(3)!!", "amd", "0000:03:00.0"),
        # https://github.com/system76/firmware-open/issues/259 (laptop, hybrid graphics)
        (
            "kernel: nvidia 0000:01:00.0: can't change power state from D3cold to D0 (config"
            " space inaccessible)",
            "nvidia",
            "0000:01:00.0",
        ),
        # drivers/pci/pci.c pci_power_up() in current kernels
        (
            "nvidia 0000:01:00.0: Unable to change power state from D3cold to D0, device"
            " inaccessible",
            "nvidia",
            "0000:01:00.0",
        ),
        # https://github.com/QubesOS/qubes-issues/issues/6923 (the resume callback fails)
        (
            "Dec 04 00:58:22 dom0 kernel: amdgpu 0000:07:00.0: PM: failed to resume async:"
            " error -62",
            "amd",
            "0000:07:00.0",
        ),
    ],
)
def test_a_card_that_does_not_come_back_is_lost(line: str, vendor: str, bus_id: str) -> None:
    got = classify(line)
    assert (got.fault_class, got.vendor, got.pci_bus_id) == (LOST, vendor, bus_id)


@pytest.mark.parametrize(
    "line",
    [
        # still waiting, not given up: https://github.com/minisforum-docs/MS-02-Ultra/issues/26
        "amdgpu 0000:03:00.0: not ready 1023ms after resume; waiting",
        # the GPU's audio function and a device on vfio-pci have no GPU driver:
        # https://github.com/pedro00dk/nvidia-exec/issues/45,
        # https://github.com/kata-containers/kata-containers/issues/11708
        "Jun 24 09:03:40 nk-zbook kernel: pci 0000:01:00.1: not ready 65535ms after resume;"
        " giving up",
        "[586739.359281] vfio-pci 0000:01:00.0: Unable to change power state from D3cold to D0,"
        " device inaccessible",
        "kernel: snd_hda_intel 0000:01:00.1: can't change power state from D3cold to D0"
        " (config space inaccessible)",
        # resume of a healthy card: https://github.com/pop-os/pop/issues/1543
        "[12996.348163] amdgpu 0000:0c:00.0: amdgpu: SMU is resumed successfully!",
        # planned resets, done for a VM by vendor-reset: https://github.com/gnif/vendor-reset/issues/5
        "[  184.603374] vfio-pci 0000:43:00.0: AMD_VEGA20: BACO reset successful",
        "[586740.186482] vfio-pci 0000:01:00.0: reset done",
    ],
)
def test_power_state_look_alikes_are_benign(line: str) -> None:
    assert classify(line).fault_class is BENIGN


# --- NVIDIA's recovery actions (Xid 154) -----------------------------------------------------

_XID154 = "GPU recovery action changed from 0x0 (None) to "


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        # the names of open-gpu-kernel-modules gpu.c _gpuRecoveryActionName; 0x1 is also
        # printed as "PF FLR" by newer drivers (open-gpu-kernel-modules issue #1307)
        ("0x1 (GPU Reset Required)", LOST),
        ("0x1 (PF FLR)", LOST),
        ("0x2 (Node Reboot Required)", LOST),
        ("0x4 (Drain and Reset)", LOST),
        ("0x3 (Drain P2P)", HANG),
        ("0x1", LOST),
        ("0x3", HANG),
        ("0x9 (Something New)", HANG),
    ],
)
def test_xid_154_reads_the_action_named(action: str, expected: FaultClass) -> None:
    assert classify_xid(154, _XID154 + action) == expected.value


def test_xid_154_back_to_none_is_not_lost() -> None:
    detail = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert classify_xid(154, detail) == BENIGN.value


def test_xid_154_lines_from_reports() -> None:
    # https://forums.developer.nvidia.com/t/xid-62-xid-154-gsp-pmu-halt-crash-on-rtx-pro-6000-blackwell-during-llm-inference/364958
    line = (
        "Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed"
        " from 0x0 (None) to 0x1 (GPU Reset Required)"
    )
    got = classify(line)
    assert (got.fault_class, got.pci_bus_id, got.xid) == (LOST, "0000:01:00.0", 154)


# --- assertions that mark a GPU for reset ----------------------------------------------------


def test_back_to_back_gsp_rpc_timeouts_are_a_hang() -> None:
    # kernel_gsp.c _kgspRpcRecvPoll; the line from open-gpu-kernel-modules issue #446
    line = (
        "192.168.11.119: kern: warning: [2026-04-22T21:30:51.526447914Z]: NVRM:"
        " nvAssertFailedNoLog: Assertion failed: Back to back GSP RPC timeout detected! GPU"
        " marked for reset @ kernel_gsp.c:2387"
    )
    assert classify(line).fault_class is HANG


# --- context both ways -----------------------------------------------------------------------

# https://github.com/CachyOS/linux-cachyos/issues/960: an application's page fault with its
# process line and GCVM details
APP_FAULT = [
    "amdgpu 0000:0d:00.0: [gfxhub] page fault (src_id:0 ring:24 vmid:4 pasid:10)",
    "amdgpu 0000:0d:00.0:  Process kwin_wayland pid 1671 thread kwin_wayla:cs0 pid 1722",
    "amdgpu 0000:0d:00.0:   in page starting at address 0x00000043800e8000 from client 0x1b"
    " (UTCL2)",
    "amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031",
    "amdgpu 0000:0d:00.0:          Faulty UTCL2 client ID: TCP (0x8)",
    "amdgpu 0000:0d:00.0:          MORE_FAULTS: 0x1",
    "amdgpu 0000:0d:00.0:          WALKER_ERROR: 0x0",
    "amdgpu 0000:0d:00.0:          PERMISSION_FAULTS: 0x3",
    "amdgpu 0000:0d:00.0:          MAPPING_ERROR: 0x0",
    "amdgpu 0000:0d:00.0:          RW: 0x0",
]


def test_details_after_an_application_page_fault_stay_app_fault() -> None:
    assert _classes(*APP_FAULT) == [APP] * len(APP_FAULT)


def test_details_after_a_fault_of_the_kernel_vm_are_a_hang() -> None:
    # https://github.com/ROCm/legacy-rocm-build/issues/2766: vmid 0, pasid 0
    header = (
        "amdgpu 0000:83:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:153 vmid:0 pasid:0,"
        " for process  pid 0 thread  pid 0)"
    )
    details = [line.replace("0000:0d:00.0:", "0000:83:00.0: amdgpu:") for line in APP_FAULT[2:]]
    assert _classes(header, *details) == [HANG] * (1 + len(details))


def test_a_process_line_after_a_ring_timeout_belongs_to_the_hang() -> None:
    # https://github.com/ROCm/legacy-rocm-build/issues/6127 and
    # https://github.com/pop-os/cosmic-comp/issues/2626 (the older "Process information:")
    assert _classes(
        "amdgpu 0000:03:00.0: amdgpu: ring comp_1.1.0 timeout, signaled seq=7, emitted seq=9",
        "amdgpu 0000:03:00.0: amdgpu:  Process gst-plugin-scan pid 4087 thread gst-plugin:cs0"
        " pid 4213",
    ) == [HANG, HANG]
    assert _classes(
        "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled"
        " seq=5000163, emitted seq=5000165",
        "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process cosmic-comp"
        " pid 3503 thread cosmic-com:cs0 pid 3539",
    ) == [HANG, HANG]


def test_the_same_process_line_after_a_page_fault_is_the_application_s() -> None:
    process = APP_FAULT[1].replace("0000:0d:00.0", "0000:03:00.0")
    header = APP_FAULT[0].replace("0000:0d:00.0", "0000:03:00.0")
    assert _classes(header, process) == [APP, APP]


def test_details_of_two_cards_interleaved_keep_their_own_card() -> None:
    # https://github.com/sgl-project/sglang/issues/10195 (MI300: two cards fault at once)
    rows = [r for r in read_rows(DATA / "kernel-log-public.tsv") if "sglang" in r.source]
    assert {r.pci_bus_id for r in rows} == {"0000:a6:00.0", "0000:06:00.0"}
    classifier = Classifier()
    got = [classifier.feed(r.line) for r in rows]
    assert [(g.fault_class, g.pci_bus_id) for g in got] == [(APP, r.pci_bus_id) for r in rows]


# --- MIG -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "instance"),
    [
        # the two forms of open-gpu-kernel-modules kernel_rc.c (GPU instance, compute instance)
        ("PCI:0000:3b:00 GPU-I:01 GPU-CI:02", 1),
        ("PCI:0000:3b:00 GPU-I:05", 5),
        ("PCI:0000:3b:00", None),
    ],
)
def test_mig_lines_keep_the_bus_id_and_read_the_instance(tag: str, instance: int | None) -> None:
    got = classify(f"NVRM: Xid ({tag}): 31, pid=9, name=a, MMU Fault")
    assert (got.pci_bus_id, got.xid, got.gpu_instance, got.fault_class) == (
        "0000:3b:00.0",
        31,
        instance,
        APP,
    )


# --- gpusv classify-kernel-log on the new lines ----------------------------------------------


def test_classify_kernel_log_json_reads_the_new_corpora(tmp_path: Path) -> None:
    rows = read_rows(DATA / "kernel-log-public.tsv") + read_rows(DATA / "kernel-log-heldout.tsv")
    log = tmp_path / "kern.log"
    log.write_text("".join(row.line + "\n" for row in rows), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.faults.classify_cli", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    objects = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["line"] for o in objects] == [row.line for row in rows]
    assert [o["class"] for o in objects] == [row.fault_class for row in rows]
    assert [o["pci_bus_id"] or "" for o in objects] == [row.pci_bus_id for row in rows]
    assert [str(o["xid"]) if o["xid"] is not None else "" for o in objects] == [
        row.xid for row in rows
    ]
