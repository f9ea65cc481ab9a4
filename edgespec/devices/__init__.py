"""Which onnxruntime execution providers this machine offers, and which to use for a device.

Takes a device name ("auto" or a profile name: cpu, cuda, dml, coreml, qnn, openvino, ...,
or a user's own profile, see `profiles`) and gives its `Profile`: the (provider, options)
list for an onnxruntime session, whether it needs static shapes, its preferred
quantization and its cost model. An unknown or unavailable device is a `DeviceError`
listing the ones available here.
"""

from __future__ import annotations

import onnxruntime as ort

from edgespec.devices.profiles import DeviceError, Profile, load_profiles

# "auto" takes the first of these available here (accelerators first, the CPU always is)
AUTO_ORDER = ["cuda", "dml", "coreml", "cpu"]


def available() -> list[str]:
    """Names of the profiles this onnxruntime build can run."""
    have = set(ort.get_available_providers())
    return [name for name, p in load_profiles().items() if p.available(have)]


def get_profile(device: str) -> Profile:
    """The profile for `device` ("auto" picks from AUTO_ORDER); it must be available here."""
    profiles = load_profiles()
    here = [name for name, p in profiles.items() if p.available()]
    if device == "auto":
        device = next(d for d in AUTO_ORDER if d in here)
    if device not in profiles:
        raise DeviceError(
            f"unknown device {device!r}; known: auto, {', '.join(profiles)} "
            "(add your own as a JSON profile in $EDGESPEC_DEVICES or ~/.config/edgespec/devices)"
        )
    if device not in here:
        provider = profiles[device].primary
        raise DeviceError(
            f"device {device!r} is not available here ({provider} is not in this onnxruntime "
            f"build or its hardware is missing); available: {', '.join(here)}. "
            "`edgespec devices` lists what this machine offers"
        )
    return profiles[device]


def providers_for(device: str) -> list[tuple[str, dict[str, str]]]:
    """(provider, options) pairs for an onnxruntime session on `device`."""
    return get_profile(device).session_providers()


__all__ = ["AUTO_ORDER", "DeviceError", "Profile", "available", "get_profile", "providers_for"]
