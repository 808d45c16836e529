"""What the PCI core and the power-management core print about a GPU that does not come back.

These messages are not the GPU driver's own: drivers/pci/pci.c and drivers/base/power print
them with the bound driver's name as the device prefix ("nvidia 0000:01:00.0: ...",
"amdgpu 0000:03:00.0: ..."), so the vendor is already known. A card that stays in a power
state, or whose resume callback fails, cannot serve until it is reset or the node rebooted.
The same messages about a GPU's audio or USB function ("snd_hda_intel", "xhci_hcd") or a
device bound to vfio-pci have no GPU vendor and never reach these rules. Pure, stdlib-only.
"""

from __future__ import annotations

import re

# drivers/pci/pci.c pci_power_up(): "Unable to change power state from %s to D0, device
# inaccessible" (older kernels: "can't change power state from %s to D0 (config space
# inaccessible)"); pci_dev_wait(): "not ready %dms after %s; giving up" (the "...; waiting"
# lines before it are not final: the device may still answer). drivers/base/power/main.c:
# "failed to resume async: error %d" and dpm_run_callback()'s "pci_pm_resume... returns %d".
# amdgpu_pci_error_detected() (amdgpu_drv.c): "pci_channel_io_perm_failure: state(%d)!!",
# the AER core telling the driver that the device is gone for good.
_LOST = re.compile(
    r"(?:Unable to|can't) change power state from D\w+ to D0"
    r"|not ready \d+ms after \w+; giving up"
    r"|failed to resume async: error -?\d+"
    r"|dpm_run_callback\(\): pci_pm_resume\S* returns -\d+"
    r"|pci_channel_io_perm_failure",
    re.I,
)


# Every pattern above holds one of these words; most GPU lines hold none, and a substring
# test costs far less than the search (the classifier sees every kernel line).
_WORDS = ("power state", "not ready", "resume", "perm_failure")


def lost(message: str) -> bool:
    """Whether `message` (prefix stripped, vendor known) says the GPU did not come back."""
    if not any(word in message for word in _WORDS):
        return False
    return _LOST.search(message) is not None
