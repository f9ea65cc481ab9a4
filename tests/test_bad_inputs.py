"""Bad input gets a clear error naming the problem and the fix, never a deep traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgespec
from edgespec.bundle import BundleError, load_manifest
from edgespec.devices import DeviceError
from edgespec.runtime.model import InputError


@pytest.fixture
def bundle_copy(bundles, tmp_path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(bundles["llama-gqa-tied"], dst)
    return dst


def edit_manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def test_missing_folder_and_missing_manifest(tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(BundleError, match="no manifest.json"):
        load_manifest(tmp_path)


def test_bundle_from_a_newer_schema_asks_for_an_upgrade(bundle_copy):
    edit_manifest(bundle_copy, lambda m: m.update(schema_version=99))
    with pytest.raises(BundleError, match="schema 99, newer than this edgespec"):
        edgespec.load(bundle_copy)


def test_corrupt_and_malformed_manifests(bundle_copy):
    (bundle_copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_manifest(bundle_copy)
    (bundle_copy / "manifest.json").write_text(
        json.dumps({"format": "edgespec-bundle", "schema_version": 1})
    )
    with pytest.raises(BundleError, match="malformed"):
        load_manifest(bundle_copy)


def test_missing_graph_file_is_named(bundle_copy):
    (bundle_copy / "tail_at_2.onnx").unlink()
    with pytest.raises(BundleError, match="missing tail_at_2.onnx"):
        load_manifest(bundle_copy)


def test_graph_whose_inputs_differ_from_the_manifest(bundle_copy):
    shutil.copy(bundle_copy / "head_at_2.onnx", bundle_copy / "full.onnx")
    with pytest.raises(BundleError, match="do not match manifest.json"):
        edgespec.load(bundle_copy)


def test_missing_role_says_how_to_export_it(bundles):
    with pytest.raises(BundleError, match="--exit-layers 3"):
        edgespec.load(bundles["gpt2"], verifier="exit:3")


@pytest.mark.parametrize(
    "prompt, options, message",
    [
        ([], {}, "prompt is empty"),
        ([5, 999_999], {}, "token id 999999 is outside the vocabulary"),
        ([-1], {}, "outside the vocabulary"),
        (list(range(1, 300)), {}, "context is 256"),
        ("hi", {"temperature": -1}, "temperature must be >= 0"),
        ("hi", {"top_p": 0}, "top_p must be in"),
        ("hi", {"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
    ],
)
def test_bad_requests_are_refused_before_any_work(bundles, prompt, options, message):
    model = edgespec.load(bundles["qwen2"])
    with pytest.raises(InputError, match=message):
        model.generate(prompt, **options)


def test_unavailable_device_lists_the_available_ones(bundles):
    with pytest.raises(DeviceError, match="available: cpu"):
        edgespec.load(bundles["qwen2"], device="qnn")


def test_export_refuses_unsupported_architecture_naming_supported_ones(tmp_path):
    from transformers import BertConfig

    from edgespec.export import ExportError, export_bundle

    BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    ).save_pretrained(tmp_path / "bert")
    supported = (
        "gemma, gemma2, gemma3_text, gpt2, granite, llama, mistral, olmo2, phi3, qwen2, qwen3, "
        "smollm3"
    )
    with pytest.raises(ExportError, match=f"'bert' is not supported; supported: {supported}"):
        export_bundle(tmp_path / "bert", tmp_path / "out")


def test_export_refuses_draft_with_another_tokenizer(checkpoints, tmp_path):
    from edgespec.export import ExportError, export_bundle
    from edgespec.export.builtin import train_tokenizer

    other = tmp_path / "other"
    shutil.copytree(checkpoints["qwen2"], other)
    train_tokenizer(other, vocab_size=1000)
    with pytest.raises(ExportError, match="does not share the tokenizer"):
        export_bundle(checkpoints["llama-gqa-tied"], tmp_path / "o", draft=other)


def test_export_option_errors(checkpoints, tmp_path):
    from edgespec.export import ExportError, export_bundle

    ck = checkpoints["gpt2"]
    with pytest.raises(ExportError, match="out of range: the model has 4 layers"):
        export_bundle(ck, tmp_path / "a", exit_layers=[4])
    with pytest.raises(ExportError, match="choose one of fp32, fp16"):
        export_bundle(ck, tmp_path / "b", dtype="bf16")
    with pytest.raises(ExportError, match="does not exist"):
        export_bundle(tmp_path / "missing", tmp_path / "c")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(ExportError, match="not empty"):
        export_bundle(ck, tmp_path / "full")
    with pytest.raises(ExportError, match="not a bundle; refusing"):
        export_bundle(ck, tmp_path / "full", overwrite=True)
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_export_config_refuses_bad_options_before_loading_anything(tmp_path):
    from edgespec.export import ExportConfig, ExportError, export_bundle

    with pytest.raises(ExportError, match="choose one of fp32, fp16"):
        ExportConfig(dtype="bf16")
    with pytest.raises(ExportError, match="--backbone-layers needs --variant shared-backbone"):
        ExportConfig(backbone_layers=2)
    with pytest.raises(ExportError, match="qdq-int8 starts from fp32 graphs"):
        ExportConfig(quantize="qdq-int8", dtype="fp16")
    with pytest.raises(TypeError, match="unknown option.*progress.*pass on_progress"):
        export_bundle(tmp_path / "missing", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_prints_one_error_line_not_a_traceback(bundle_copy):
    edit_manifest(bundle_copy, lambda m: m.update(schema_version=7))
    run = subprocess.run(
        [sys.executable, "-m", "edgespec.cli", "generate", str(bundle_copy), "-p", "hi"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert run.stderr.startswith("Error: ") and "Traceback" not in run.stderr
    assert "schema 7" in run.stderr
