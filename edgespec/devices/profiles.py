"""Device profiles: JSON data files saying how to run a bundle on one kind of hardware.

A profile names the onnxruntime execution providers to try, in order, with their options;
whether the hardware needs static shapes (NPUs do); the quantization it prefers; and its cost
model: memory bandwidth (GB/s) and an `energy` table that `runtime.policies.channel.EnergyModel`
reads (J per draft token, or drafting power, and the radio's figures).

Built-in profiles ship in `edgespec/devices/profiles/*.json`. Users add or override them
with their own files: every `*.json` in the folders named by `$EDGESPEC_DEVICES`
(os.pathsep-separated) or, when that is unset, `$XDG_CONFIG_HOME/edgespec/devices`
(default `~/.config/edgespec/devices`). Every file is validated on load; a bad one is a
`DeviceError` naming the file, the field and the fix. numpy-free, torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from edgespec.errors import EdgespecError

BUILTIN_DIR = Path(__file__).parent / "profiles"
# listing order of the built-in profiles (others follow by name)
BUILTIN_ORDER = ["cpu", "cuda", "dml", "coreml", "qnn", "openvino", "openvino-gpu", "openvino-npu"]
QUANTIZATIONS = ("none", "int8", "int4", "qdq-int8")
# EnergyModel's fields (runtime/policies/channel.py); checked here so a typo fails at load time.
ENERGY_KEYS = {
    "draft_power_w",
    "joules_per_draft_token",
    "tx_joules_per_byte",
    "rx_joules_per_byte",
    "wait_power_w",
}
# SessionOptions flags a profile may set (DirectML needs enable_mem_pattern off).
SESSION_FLAGS = {"enable_mem_pattern", "enable_cpu_mem_arena", "enable_mem_reuse"}
KEYS = {
    "name",
    "description",
    "providers",
    "session_options",
    "static_shapes",
    "quantization",
    "memory_bandwidth_gbps",
    "energy",
}
REQUIRED = ("name", "providers")


class DeviceError(EdgespecError, ValueError):
    """An unknown or unavailable device, or a malformed profile; the message says the fix."""


@dataclass
class Profile:
    name: str
    providers: list[tuple[str, dict[str, str]]]
    description: str = ""
    session_options: dict[str, bool] = field(default_factory=dict)
    static_shapes: bool = False
    quantization: str = "none"
    memory_bandwidth_gbps: float | None = None
    energy: dict[str, float] = field(default_factory=dict)
    source: str = "built-in"  # or the user file's path

    @property
    def primary(self) -> str:
        return self.providers[0][0]

    def available(self, have: set[str] | None = None) -> bool:
        """Its first provider is in this onnxruntime build (and, for OpenVINO, the device
        type it asks for is one OpenVINO sees here)."""
        have = set(ort.get_available_providers()) if have is None else have
        if self.primary not in have:
            return False
        wanted = self.providers[0][1].get("device_type")
        if self.primary == "OpenVINOExecutionProvider" and wanted:
            devices = openvino_devices()
            return devices is None or any(d.split(".")[0] == wanted for d in devices)
        return True

    def session_providers(self) -> list[tuple[str, dict[str, str]]]:
        """(provider, options) pairs for `ort.InferenceSession`, those not in this build
        dropped (a CPU fallback stays when present)."""
        have = set(ort.get_available_providers())
        return [(p, dict(o)) for p, o in self.providers if p in have]

    def apply_session_options(self, options: ort.SessionOptions) -> None:
        for flag, value in self.session_options.items():
            setattr(options, flag, value)

    def policy_profile(self) -> dict[str, Any]:
        """What `make_policy(device_profile=...)` / `EnergyModel.from_profile` accept."""
        return {"energy": dict(self.energy)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "providers": [{"name": p, "options": o} for p, o in self.providers],
            "session_options": self.session_options,
            "static_shapes": self.static_shapes,
            "quantization": self.quantization,
            "memory_bandwidth_gbps": self.memory_bandwidth_gbps,
            "energy": self.energy,
            "source": self.source,
        }


def openvino_devices() -> list[str] | None:
    """OpenVINO's device ids ("CPU", "GPU.0", "NPU") in an onnxruntime-openvino build."""
    try:
        from onnxruntime.capi import _pybind_state as C

        return list(C.get_available_openvino_device_ids())
    except (ImportError, AttributeError, RuntimeError):
        return None


def user_dirs() -> list[Path]:
    env = os.environ.get("EDGESPEC_DEVICES")
    if env is not None:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path(config) / "edgespec" / "devices"]


def load_profiles() -> dict[str, Profile]:
    """Every profile by name: the built-in ones, then user files (which may override)."""
    profiles: dict[str, Profile] = {}
    rank = {name: i for i, name in enumerate(BUILTIN_ORDER)}
    files = sorted(BUILTIN_DIR.glob("*.json"), key=lambda f: (rank.get(f.stem, 99), f.stem))
    for path in files:
        p = read_profile(path, "built-in")
        profiles[p.name] = p
    for folder in user_dirs():
        if folder.exists() and not folder.is_dir():
            raise DeviceError(f"device profile folder {folder} is a file; point it at a folder")
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            p = read_profile(path, str(path))
            profiles[p.name] = p
    return profiles


def read_profile(path: Path, source: str) -> Profile:
    """Parse and validate one profile file."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DeviceError(f"device profile {path} is not valid JSON: {e}") from None
    except OSError as e:
        raise DeviceError(f"cannot read device profile {path}: {e.strerror}") from None
    try:
        return parse_profile(data, source)
    except DeviceError as e:
        raise DeviceError(f"device profile {path}: {e}") from None


def parse_profile(data: Any, source: str = "built-in") -> Profile:
    if not isinstance(data, dict):
        raise DeviceError("must be a JSON object with at least 'name' and 'providers'")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DeviceError(f"missing {', '.join(missing)} (needs at least 'name' and 'providers')")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise DeviceError(f"unknown keys {unknown}; known keys are {sorted(KEYS)}")
    name = data["name"]
    if not isinstance(name, str) or not name or name == "auto" or any(c.isspace() for c in name):
        raise DeviceError(f"'name' must be a non-empty word other than 'auto', got {name!r}")
    providers = _providers(data["providers"])
    session = data.get("session_options", {})
    if not isinstance(session, dict) or not set(session) <= SESSION_FLAGS:
        raise DeviceError(f"'session_options' may only set {sorted(SESSION_FLAGS)} to true/false")
    if not all(isinstance(v, bool) for v in session.values()):
        raise DeviceError("'session_options' values must be true or false")
    static = data.get("static_shapes", False)
    if not isinstance(static, bool):
        raise DeviceError(f"'static_shapes' must be true or false, got {static!r}")
    quant = data.get("quantization", "none")
    if quant not in QUANTIZATIONS:
        raise DeviceError(
            f"'quantization' must be one of {', '.join(QUANTIZATIONS)}, got {quant!r}"
        )
    bandwidth = data.get("memory_bandwidth_gbps")
    if bandwidth is not None and not _positive(bandwidth):
        raise DeviceError(f"'memory_bandwidth_gbps' must be a positive number, got {bandwidth!r}")
    energy = data.get("energy", {})
    if not isinstance(energy, dict):
        raise DeviceError(f"'energy' must be an object, got {energy!r}")
    bad = sorted(set(energy) - ENERGY_KEYS)
    if bad:
        raise DeviceError(f"unknown energy settings {bad}; known are {sorted(ENERGY_KEYS)}")
    for k, v in energy.items():
        if not (_positive(v) or v == 0):
            raise DeviceError(f"energy '{k}' must be a number >= 0, got {v!r}")
    return Profile(
        name=name,
        providers=providers,
        description=str(data.get("description", "")),
        session_options=dict(session),
        static_shapes=static,
        quantization=quant,
        memory_bandwidth_gbps=None if bandwidth is None else float(bandwidth),
        energy={k: float(v) for k, v in energy.items()},
        source=source,
    )


def _providers(raw: Any) -> list[tuple[str, dict[str, str]]]:
    if not isinstance(raw, list) or not raw:
        raise DeviceError(
            "'providers' must be a non-empty list like "
            '[{"name": "CUDAExecutionProvider", "options": {}}, {"name": "CPUExecutionProvider"}]'
        )
    out = []
    for entry in raw:
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise DeviceError(f"each provider needs a 'name' string, got {entry!r}")
        if not entry["name"].endswith("ExecutionProvider"):
            raise DeviceError(
                f"provider {entry['name']!r} is not an onnxruntime execution provider name "
                "(like CPUExecutionProvider); see `edgespec devices` for this build's list"
            )
        options = entry.get("options", {})
        extra = sorted(set(entry) - {"name", "options"})
        if not isinstance(options, dict) or extra:
            raise DeviceError(f"provider {entry['name']!r}: give only 'name' and 'options' {{}}")
        # onnxruntime takes provider options as strings
        out.append((entry["name"], {str(k): _option(v) for k, v in options.items()}))
    return out


def _option(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
