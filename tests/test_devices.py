"""Device profiles: built-in JSON files, user profiles, validation, and --device selection."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.cli import main
from edgespec.devices import DeviceError, available, get_profile, providers_for
from edgespec.devices.profiles import BUILTIN_ORDER, load_profiles
from edgespec.runtime.policies.channel import EnergyModel
from edgespec.runtime.registry import make_policy


@pytest.fixture(autouse=True)
def user_folder(tmp_path, monkeypatch):
    """Every test reads user profiles from its own empty folder, never the real ~/.config."""
    folder = tmp_path / "devices"
    folder.mkdir()
    monkeypatch.setenv("EDGESPEC_DEVICES", str(folder))
    return folder


def write(folder, name, profile) -> None:
    text = profile if isinstance(profile, str) else json.dumps(profile)
    (folder / f"{name}.json").write_text(text)


def test_every_builtin_profile_loads_with_its_cost_model_and_the_cpu_is_available():
    profiles = load_profiles()
    assert list(profiles) == BUILTIN_ORDER
    for p in profiles.values():
        assert p.providers and p.memory_bandwidth_gbps and p.energy
        EnergyModel.from_profile(p.policy_profile())  # the policy accepts every energy table
    assert profiles["qnn"].static_shapes and profiles["qnn"].quantization == "qdq-int8"
    assert profiles["openvino-npu"].static_shapes and not profiles["cpu"].static_shapes
    assert "cpu" in available()
    assert providers_for("cpu") == [("CPUExecutionProvider", {})]
    assert get_profile("auto").available()


def test_unknown_device_is_refused_naming_the_known_ones():
    with pytest.raises(DeviceError, match=r"unknown device 'tpu'; known: auto, cpu, cuda"):
        get_profile("tpu")


def test_unavailable_device_is_refused_listing_the_available_ones(bundles):
    if "QNNExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has QNN")
    with pytest.raises(DeviceError, match=r"'qnn' is not available here .*available: cpu"):
        edgespec.load(bundles["qwen2"], device="qnn")
    r = CliRunner().invoke(main, ["generate", str(bundles["qwen2"]), "-p", "hi", "--device", "qnn"])
    assert r.exit_code == 1 and "Error: device 'qnn' is not available here" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["serve", str(bundles["qwen2"]), "--device", "qnn"])
    assert r.exit_code == 1 and "Error: device 'qnn' is not available here" in r.output


def test_user_profile_is_listed_and_selects_its_providers_and_options(bundles, user_folder):
    write(
        user_folder,
        "mine",
        {
            "name": "cpu-lean",
            "providers": [{"name": "CPUExecutionProvider", "options": {}}],
            "session_options": {"enable_cpu_mem_arena": False},
            "quantization": "int8",
            "memory_bandwidth_gbps": 12.5,
            "energy": {"joules_per_draft_token": 0.01},
        },
    )
    r = CliRunner().invoke(main, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    rows = {p["name"]: p for p in json.loads(r.output)["profiles"]}
    assert rows["cpu-lean"]["available"] and rows["cpu-lean"]["source"].endswith("mine.json")
    assert rows["cpu-lean"]["memory_bandwidth_gbps"] == 12.5
    assert "cpu-lean" in CliRunner().invoke(main, ["devices"]).output

    mine = edgespec.load(bundles["qwen2"], device="cpu-lean")
    session = mine.target.stages[0].session
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_session_options().enable_cpu_mem_arena is False
    base = edgespec.load(bundles["qwen2"])
    prompt = [5, 9, 200, 31]
    assert (
        mine.generate(prompt, max_new_tokens=8).tokens
        == base.generate(prompt, max_new_tokens=8).tokens
    )
    # its energy table prices the split policy's rounds
    policy = make_policy("channel-aware", [], None, get_profile("cpu-lean").policy_profile())
    assert policy.energy.joules_per_draft_token == 0.01


def test_user_profile_overrides_a_builtin_one_of_the_same_name(user_folder):
    write(user_folder, "cpu", {"name": "cpu", "providers": ["CPUExecutionProvider"]})
    assert get_profile("cpu").source.endswith("cpu.json") and get_profile("cpu").energy == {}


def test_user_profile_for_a_missing_provider_is_listed_as_unavailable(user_folder):
    write(user_folder, "x", {"name": "xnn", "providers": ["XnnpackExecutionProvider"]})
    if "XnnpackExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has XNNPACK")
    assert "xnn" in load_profiles() and "xnn" not in available()
    with pytest.raises(DeviceError, match="'xnn' is not available here"):
        get_profile("xnn")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not valid JSON"),
        ('["cpu"]', "must be a JSON object"),
        ('{"name": "a"}', "missing providers"),
        ('{"name": "a", "providers": [], "x": 1}', r"unknown keys \['x'\]"),
        ('{"name": "a", "providers": []}', "'providers' must be a non-empty list"),
        ('{"name": "a", "providers": ["CPU"]}', "not an onnxruntime execution provider"),
        ('{"name": "auto", "providers": ["CPUExecutionProvider"]}', "other than 'auto'"),
        (
            '{"name": "a", "providers": ["CPUExecutionProvider"], "quantization": "int3"}',
            "'quantization' must be one of none, int8, int4, qdq-int8",
        ),
        (
            '{"name": "a", "providers": ["CPUExecutionProvider"], "energy": {"watts": 2}}',
            r"unknown energy settings \['watts'\]",
        ),
        (
            '{"name": "a", "providers": ["CPUExecutionProvider"], "memory_bandwidth_gbps": -1}',
            "'memory_bandwidth_gbps' must be a positive number",
        ),
        (
            '{"name": "a", "providers": ["CPUExecutionProvider"], "static_shapes": "yes"}',
            "'static_shapes' must be true or false",
        ),
    ],
)
def test_malformed_user_profile_is_refused_naming_the_file_and_the_problem(
    user_folder, text, message
):
    write(user_folder, "bad", text)
    with pytest.raises(DeviceError, match=message) as e:
        load_profiles()
    assert str(user_folder / "bad.json") in str(e.value)
    r = CliRunner().invoke(main, ["devices"])
    assert r.exit_code == 1 and "bad.json" in r.output and "Traceback" not in r.output
