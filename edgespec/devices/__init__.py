"""Which onnxruntime execution providers this machine offers, and which to use for a device.

Takes a device name ("cpu", "auto", or a provider's short name) and gives the provider list
for an onnxruntime session; an unavailable device is a `DeviceError` listing what is here.
"""

from __future__ import annotations

import onnxruntime as ort

SHORT_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
}
AUTO_ORDER = ["cuda", "dml", "coreml", "cpu"]


class DeviceError(ValueError):
    """The requested device is not available here."""


def available() -> list[str]:
    """Short names of the devices this onnxruntime build can use."""
    have = set(ort.get_available_providers())
    return [short for short, provider in SHORT_NAMES.items() if provider in have]


def providers_for(device: str) -> list[str]:
    here = available()
    if device == "auto":
        device = next(d for d in AUTO_ORDER if d in here)
    if device not in SHORT_NAMES:
        raise DeviceError(f"unknown device {device!r}; known: auto, {', '.join(SHORT_NAMES)}")
    if device not in here:
        raise DeviceError(f"device {device!r} is not available here; available: {', '.join(here)}")
    chosen = SHORT_NAMES[device]
    return [chosen] if chosen == "CPUExecutionProvider" else [chosen, "CPUExecutionProvider"]
