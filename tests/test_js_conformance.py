"""The JavaScript package (`js/`) reproduces the Python runtime token for token.

The Python runtime writes conformance vectors over tiny random bundles exported for
onnxruntime's JavaScript packages (`batched_verify=False`): the ids of texts per tokenizer,
decoded text, chat templates rendered, and greedy outputs of every mode the package runs
(`ar`, `spec`, `self-spec`, `lookup`; `fixed` and `confidence` policies; drafts rejected
and accepted), seeded sampled outputs, and two-turn chats that keep their caches, each with
the KV path `load()` picks (the graphs edited to return only new positions on
onnxruntime-node 1.30/1.31) and again with the cache as preallocated outputs ("bound"). `node`
runs `js/conformance.mjs` on the built package and the test compares item by item. A bundle with a
feature head (a tiny GGUF through `edgespec distill`: a default export, query_seqlens and all,
whose `eagle` graph reads the target's features) has its own vectors: `ar`, `eagle` and
`lookup+eagle`, greedy and sampled, on the worker thread, the app's thread (both KV paths) and
the route of the browser and React Native (graphs and weights files as bytes). The package is
built here (`npm ci` when `node_modules` is missing, then `npm run build` when `dist/` is
older than `src/`); the test skips only when `node` is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chat_templates import TEMPLATES  # noqa: E402
from conftest import write_chat_checkpoint  # noqa: E402

JS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)")

TEXTS = [
    "def parse(x):\n    return  x + 1  # sum",
    "Hello, world! It's 2026; naïve café — 世界 🙂\r\n\ttabs  and   spaces ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>ok</think>",
    "import os, sys\nfor i in range(10):\n\tprint(f'{i:03d}')\n\n\n",
    # spaces before punctuation stay (transformers' clean-up would drop them)
    "f(a , b) . c ? d ! e isn 't it ' s x 're y 've z 'm",
    "   leading spaces, 12345678901234 digits, UPPER lower MiXeD's don't",
    "",
]
PROMPTS = ["def parse(x):\n    return", "import os\nimport sys\nimport os\nimport"]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
]
CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi there"}],
    "system": CHAT
    + [{"role": "assistant", "content": "7"}, {"role": "user", "content": "Another?"}],
}
MAX_NEW = 40
# seeded sampling: the JS package draws numpy's stream (PCG64) and builds draft q as Python
# does, so sampled outputs match too
SAMPLING = [
    dict(temperature=0.8, seed=7),
    dict(temperature=1.3, top_p=0.9, top_k=50, seed=12345),
]
SAMPLED_MODES = {"ar", "lookup", "spec", "self-spec", "eagle"}
# (mode, policy, exit layer, drafter) per generation and chat
RUNS = [
    ("ar", None, None, None),
    ("spec", "fixed:4", None, None),
    ("spec", "fixed:1", None, None),
    ("spec", "confidence:0.05", None, None),
    ("spec", "auto", None, None),
    ("self-spec", "fixed:3", 2, None),
    ("self-spec", "confidence:0.05", 2, None),
    ("lookup", "fixed:4", None, None),
]
EAGLE_RUNS = [
    ("ar", None, None, None),
    ("eagle", "fixed:3", None, None),
    ("eagle", "fixed:1", None, None),
    ("eagle", "confidence:0.05", None, None),
    ("eagle", "auto", None, None),
    ("eagle", "fixed:4", None, "lookup+eagle"),
    ("eagle", "auto", None, "lookup+eagle"),
]


def build_js() -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("node is installed but npm is not: install npm to build js/")
    if not (JS / "node_modules").exists():
        subprocess.run([npm, "ci"], cwd=JS, check=True, timeout=600, capture_output=True)
    dist = JS / "dist" / "node.js"
    newest = max(p.stat().st_mtime for p in (JS / "src").glob("*.ts"))
    if not dist.exists() or dist.stat().st_mtime < newest:
        subprocess.run([npm, "run", "build"], cwd=JS, check=True, timeout=600, capture_output=True)


@pytest.fixture(scope="module")
def js_bundles(tmp_path_factory) -> dict[str, Path]:
    """A chat bundle whose draft is another random model (drafts mostly rejected) and one
    whose draft is the target itself (every draft accepted: the bonus-token path), each with
    an exit at layer 2, exported for onnxruntime 1.30 (no query_seqlens)."""
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("js_conformance")
    target = write_chat_checkpoint(root / "t", seed=0)
    draft = write_chat_checkpoint(root / "d", seed=1)
    out = {"chat": root / "chat", "self-draft": root / "self-draft"}
    export_bundle(target, out["chat"], draft=draft, exit_layers=[2], batched_verify=False)
    export_bundle(target, out["self-draft"], draft=target, exit_layers=[2], batched_verify=False)
    return out


POLICY_ROUNDS = 240


def policy_vectors() -> list[dict]:
    """The plans of `auto` and `acceptance` over a fixed stream of round outcomes (acceptance
    runs, round times, draft times; a new generation every 60 rounds for the warm-up pricing):
    each round drafts what the policy planned, so the policy's whole estimate is exercised."""
    import numpy as np

    from edgespec.runtime.policies.draft_length import Acceptance, Auto
    from edgespec.runtime.stats import RoundStats

    rng = np.random.default_rng(3)
    runs = np.where(rng.random(POLICY_ROUNDS) < 0.5, rng.integers(0, 13, POLICY_ROUNDS), 0)
    table = dict(
        accepted=[int(x) for x in runs],
        base=[float(x) for x in 0.004 + 0.002 * rng.random(POLICY_ROUNDS)],
        verify=[float(x) for x in 0.0002 * rng.random(POLICY_ROUNDS)],
        draft=[float(x) for x in 0.0004 + 0.0008 * rng.random(POLICY_ROUNDS)],
    )
    out = []
    for name, policy in (("auto", Auto()), ("acceptance", Acceptance())):
        plans = []
        for i in range(POLICY_ROUNDS):
            g = policy.plan(None).length
            plans.append(g)
            n = min(g, table["accepted"][i])
            draft = g * table["draft"][i]
            seconds = table["base"][i] + g * table["verify"][i] + draft
            stats = RoundStats("decode", n + 1, g + 1, seconds, drafted=g, accepted=n)
            stats.draft_seconds, stats.index = draft, i % 60 + 1
            policy.observe(stats)
        out.append(dict(name=name, table=table, plans=plans))
    return out


@pytest.fixture(scope="module")
def eagle_bundle(tmp_path_factory) -> Path:
    """A tiny GGUF distilled for a few seconds: a default export (batched graphs, which the
    package opens without query_seqlens) with a feature head."""
    pytest.importorskip("torch", reason="edgespec distill trains with torch (the distill extra)")
    pytest.importorskip("gguf", reason="the tiny GGUF is written with the gguf package")
    return distilled_bundle(tmp_path_factory.mktemp("js_eagle"))


def distilled_bundle(root: Path, qtype: str = "Q4_1") -> Path:
    """A tiny GGUF of `qtype` blocks with a head distilled for a few seconds, over a draft
    vocabulary of 128 of its 265 ids (the graph lays the head's logits on the target's ids,
    -inf where no draft id maps: what a sampled draft's q is built from)."""
    from gguf_files import write_gguf

    from edgespec.distill.pipeline import DistillConfig, distill
    from edgespec.distill.train import TrainConfig

    write_gguf(root / "m.gguf", "llama", qtype)
    prompts = root / "prompts.jsonl"
    rows = [{"prompt": f"the cat {i} sat on the"} for i in range(6)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = DistillConfig(minutes=0.1, prompts=prompts, new_tokens=16)
    config.train = TrainConfig(draft_vocab=128)
    distill(root / "m.gguf", root / "b", config)
    return root / "b"


def python_vectors(
    bundles: dict[str, Path],
    runs: list = RUNS,
    checks: bool = True,
    abort: tuple = ("spec", None),
    threads: tuple = ("worker",),
) -> dict:
    """The Python runtime's outputs of `runs` on each bundle; `checks`: the chat templates and
    policy plans too; `abort`: the (mode, drafter) the cancellation check loads; `threads`:
    where Node runs the generations ("worker": `load()`'s default, "main": the app's thread,
    "bytes": the browser's and React Native's route, every file read as bytes, "bound": the
    app's thread with the KV cache as preallocated outputs, where load() would pick
    "appended" on onnxruntime-node 1.30/1.31: `KVOutputs` in js/src/graph.ts)."""
    from edgespec.bundle import load_manifest
    from edgespec.runtime.chat.template import ChatTemplate, ChatTemplateError
    from edgespec.runtime.model import Model

    vectors: dict = {
        "bundles": [],
        "templates": [],
        "policies": policy_vectors() if checks else [],
        "abort": dict(mode=abort[0], drafter=abort[1]),
        "threads": list(threads),
    }
    first = next(iter(bundles.values()))
    chat = ChatTemplate.from_bundle(first, load_manifest(first))
    special = chat.special_tokens
    named = {"bundle": chat.templates["default"], **TEMPLATES} if checks else {}
    for name, text in named.items():
        for label, messages in CONVERSATIONS.items():
            flags = {"date_string": "26 Nov 2026"}  # llama3 would print today's date
            try:
                rendered = ChatTemplate({"default": text}, special).render(messages, **flags)
            except ChatTemplateError:  # e.g. Gemma's refusal of a system message
                rendered = None
            vectors["templates"].append(
                dict(
                    name=f"{name}/{label}",
                    template=text,
                    special_tokens=special,
                    messages=messages,
                    flags=flags,
                    expected=rendered,
                )
            )
    for name, path in bundles.items():
        entry: dict = {
            "name": name,
            "path": str(path),
            "texts": TEXTS,
            "generations": [],
            "chats": [],
        }
        tokenizer = None
        template = ChatTemplate.from_bundle(path, load_manifest(path))
        for mode, policy, exit_layer, drafter in runs:
            options = {"draft_policy": policy} if policy else {}
            if drafter:
                options["drafter"] = drafter
            model = Model.load(path, mode=mode, exit_layer=exit_layer, **options)
            tokenizer = model.tokenizer
            cases = [dict(prompt=p, chat=None, sampling=None) for p in PROMPTS]
            cases.append(dict(prompt=None, chat=CHAT, sampling=None))
            if mode in SAMPLED_MODES and policy != "auto":  # draws follow γ, which is timed
                cases += [dict(prompt=PROMPTS[0], chat=None, sampling=s) for s in SAMPLING]
            for case in cases:
                prompt = case["prompt"] or template.render(case["chat"])
                ignore_eos = case["chat"] is None
                sampling = case["sampling"] or {}
                g = model.generate(
                    prompt, max_new_tokens=MAX_NEW, ignore_eos=ignore_eos, **sampling
                )
                entry["generations"].append(
                    dict(
                        mode=mode,
                        policy=policy,
                        exit_layer=exit_layer,
                        drafter=drafter,
                        **case,
                        max_new_tokens=MAX_NEW,
                        ignore_eos=ignore_eos,
                        tokens=g.tokens,
                        text=g.text,
                        finish_reason=g.finish_reason,
                        drafted=g.stats.drafted,
                        accepted=g.stats.accepted,
                    )
                )
            # a conversation of two turns: the second keeps the first's caches
            first = model.chat(CHAT, max_new_tokens=MAX_NEW)
            more = [
                {"role": "assistant", "content": first.text},
                {"role": "user", "content": "More?"},
            ]
            second = model.chat(CHAT + more, max_new_tokens=MAX_NEW)
            entry["chats"].append(
                dict(
                    mode=mode,
                    policy=policy,
                    exit_layer=exit_layer,
                    drafter=drafter,
                    turns=[CHAT, CHAT + more],
                    max_new_tokens=MAX_NEW,
                    tokens=[first.tokens, second.tokens],
                    cached=[first.cached_tokens, second.cached_tokens],
                )
            )
        assert tokenizer is not None
        entry["ids"] = [tokenizer.encode(t) for t in TEXTS]
        entry["decode"] = [tokenizer.encode(t) for t in TEXTS[:5]]
        entry["decoded"] = [
            tokenizer.decode(ids, skip_special_tokens=True) for ids in entry["decode"]
        ]
        entry["streamed"] = [streamed(tokenizer, ids) for ids in entry["decode"]]
        vectors["bundles"].append(entry)
    return vectors


def streamed(tokenizer, ids: list[int]) -> list[str]:
    """The pieces a stream of `ids` releases, one per id, then the flush."""
    detok = tokenizer.stream_decoder(skip_special_tokens=True)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.fixture(scope="module")
def conformance(js_bundles, tmp_path_factory) -> tuple[dict, dict]:
    return run_node(python_vectors(js_bundles, threads=("worker", "bound")), tmp_path_factory)


@pytest.fixture(scope="module")
def eagle_conformance(eagle_bundle, tmp_path_factory) -> tuple[dict, dict]:
    vectors = python_vectors(
        {"eagle": eagle_bundle},
        EAGLE_RUNS,
        False,
        ("eagle", "lookup+eagle"),
        ("worker", "main", "bytes", "bound"),
    )
    return run_node(vectors, tmp_path_factory)


def run_node(vectors: dict, tmp_path_factory) -> tuple[dict, dict]:
    build_js()
    folder = tmp_path_factory.mktemp("vectors")
    (folder / "vectors.json").write_text(json.dumps(vectors))
    run = subprocess.run(
        [NODE, str(JS / "conformance.mjs"), str(folder / "vectors.json"), str(folder / "js.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"node failed:\n{run.stderr[-3000:]}"
    return vectors, json.loads((folder / "js.json").read_text())


def test_js_loads_every_mode_of_the_bundles(conformance):
    _, js = conformance
    assert js["errors"] == []


def test_js_tokenizer_gives_the_python_runtimes_ids(conformance):
    vectors, js = conformance
    expected = [
        (b["name"], text, ids)
        for b in vectors["bundles"]
        for text, ids in zip(b["texts"], b["ids"], strict=True)
    ]
    got = [(t["bundle"], t["text"], t["ids"]) for t in js["tokenizer"]]
    assert got == expected
    decoded = [(d["bundle"], d["text"]) for d in js["decode"]]
    assert decoded == [(b["name"], t) for b in vectors["bundles"] for t in b["decoded"]]
    # streamed text: the same piece after each id as the Python runtime's stream decoder
    streamed = [(d["bundle"], d["streamed"]) for d in js["decode"]]
    assert streamed == [(b["name"], p) for b in vectors["bundles"] for p in b["streamed"]]


def test_js_renders_chat_templates_as_python_does(conformance):
    vectors, js = conformance
    for want, got in zip(vectors["templates"], js["templates"], strict=True):
        if want["expected"] is None:  # refused by the template: refused in JS too
            assert got["text"].startswith("error: the chat template refused"), want["name"]
        else:
            assert got["text"] == want["expected"], want["name"]


def test_js_greedy_output_equals_python_per_mode(conformance):
    same_generations(*conformance)


def same_generations(vectors: dict, js: dict) -> None:
    want = [
        (thread, b["name"], g)
        for thread in vectors["threads"]
        for b in vectors["bundles"]
        for g in b["generations"]
    ]
    assert len(js["generations"]) == len(want)
    for (thread, bundle, w), g in zip(want, js["generations"], strict=True):
        where = f"{thread} {bundle} {w['mode']} {w['drafter']} {w['policy']} "
        where += f"{w['prompt'] or 'chat'!r} {w['sampling']}"
        assert g["thread"] == thread, where
        assert g["tokens"] == w["tokens"], where
        assert g["text"] == w["text"], where
        assert g["finish_reason"] == w["finish_reason"], where
        # the same drafts proposed and accepted: the loop is the same loop, not only its output
        # (auto plans from measured times, so only its output is compared; its plans are
        # compared on a fixed stream of rounds in test_js_adaptive_policies_plan_as_python_does)
        if w["policy"] != "auto":
            assert (g["drafted"], g["accepted"]) == (w["drafted"], w["accepted"]), where


def test_conformance_exercises_accepted_and_rejected_drafts(conformance):
    vectors, _ = conformance
    spec = [g for b in vectors["bundles"] for g in b["generations"] if g["mode"] == "spec"]
    assert any(g["accepted"] == g["drafted"] > 0 for g in spec)  # the self-draft bundle
    assert any(g["accepted"] < g["drafted"] for g in spec)  # the random draft
    sampled = [g for g in spec if g["sampling"]]
    assert any(g["accepted"] < g["drafted"] for g in sampled)  # the residual draw
    assert any(g["accepted"] > 0 for g in sampled)  # min(1, p/q) accepting


def cli(*args: str) -> subprocess.CompletedProcess:
    build_js()
    return subprocess.run(
        [NODE, str(JS / "dist" / "cli.js"), *args], capture_output=True, text=True, timeout=300
    )


def test_js_cli_generates_with_stats(js_bundles):
    run = cli("generate", str(js_bundles["self-draft"]), "-p", "def f(", "--mode", "spec",
              "--max-new-tokens", "8", "--ignore-eos", "--stats")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "8 tokens" in run.stderr and "accepted" in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "split"], "split mode needs a server"),
        (["--mode", "spec", "--server", "ws://127.0.0.1:1"], "split and drafter are split mode's"),
        (["--mode", "spec", "--draft-policy", "dynamic-exit"], "runs in the Python runtime"),
        (["--mode", "ar", "--draft-policy", "fixed:2"], "mode 'ar' drafts nothing"),
        (["--mode", "self-spec", "--exit-layer", "3"], "exit layer 3 is not in this bundle"),
        (["--max-new-tokens", "0"], "maxNewTokens must be"),
        (["--temperature=-1"], "temperature must be >= 0"),
    ],
)
def test_js_refuses_bad_options_with_the_fix(js_bundles, args, message):
    run = cli("generate", str(js_bundles["chat"]), "-p", "hi", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "at " not in run.stderr  # a message, not a stack trace


def test_js_refuses_bad_bundles_with_the_fix(js_bundles, tmp_path):
    run = cli("generate", str(tmp_path / "nowhere"), "-p", "hi")
    assert run.returncode == 2 and "does not exist" in run.stderr, run.stderr
    run = cli("generate", str(tmp_path), "-p", "hi")
    assert run.returncode == 2 and "not an edgespec bundle" in run.stderr, run.stderr
    # a manifest declaring query_seqlens (a default export's) over graphs without it
    batched = tmp_path / "batched"
    shutil.copytree(js_bundles["chat"], batched)
    manifest = json.loads((batched / "manifest.json").read_text())
    manifest["graphs"][0]["inputs"].append(
        {"name": "query_seqlens", "dtype": "int32", "shape": ["batch"]}
    )
    (batched / "manifest.json").write_text(json.dumps(manifest))
    run = cli("generate", str(batched), "-p", "hi", "--mode", "spec")
    assert run.returncode == 2 and "takes query_seqlens" in run.stderr, run.stderr
    assert "re-export the bundle" in run.stderr and "at " not in run.stderr
    broken = tmp_path / "broken"
    shutil.copytree(js_bundles["chat"], broken)
    (broken / "draft.onnx").unlink()
    run = cli("generate", str(broken), "-p", "hi")
    assert run.returncode == 2 and "incomplete: missing draft.onnx" in run.stderr, run.stderr


def test_js_chat_keeps_the_conversations_caches_as_python_does(conformance):
    same_chats(*conformance)


def same_chats(vectors: dict, js: dict) -> None:
    want = [(b["name"], c) for b in vectors["bundles"] for c in b["chats"]]
    assert len(js["chats"]) == len(want)
    for (bundle, w), got in zip(want, js["chats"], strict=True):
        where = f"{bundle} {w['mode']} {w['drafter']} {w['policy']}"
        assert got["tokens"] == w["tokens"], where
        assert got["cached"] == w["cached"], where
        assert got["cached"][1] > 0, where  # the second turn prefilled only what was new


def test_js_abort_signal_ends_a_stream_and_the_model_goes_on(conformance):
    _, js = conformance
    assert js["abort"] == {"error": "AbortError", "chunks": 1, "same": True}


def test_js_adaptive_policies_plan_as_python_does(conformance):
    vectors, js = conformance
    for want, got in zip(vectors["policies"], js["policies"], strict=True):
        assert got["plans"] == want["plans"], want["name"]
    plans = vectors["policies"][0]["plans"]
    assert 0 in plans and max(plans) > 2  # auto both stepped plainly and speculated


# -- a bundle with a feature head (edgespec distill) -------------------------------------------


def test_js_loads_a_distilled_bundles_head(eagle_conformance):
    vectors, js = eagle_conformance
    assert js["errors"] == []
    b = vectors["bundles"][0]  # the GGUF's own tokenizer, built by the import
    assert [t["ids"] for t in js["tokenizer"]] == b["ids"]
    assert [d["text"] for d in js["decode"]] == b["decoded"]


def test_js_feature_head_output_equals_python_per_mode(eagle_conformance):
    """eagle and lookup+eagle, greedy and seeded sampling, on the worker thread, the app's and
    with every file read as bytes (the head's graph names two weights files): the same tokens,
    and (but for `auto`, which plans from measured times) the same drafts proposed and
    accepted."""
    vectors, js = eagle_conformance
    same_generations(vectors, js)
    eagle = [g for g in vectors["bundles"][0]["generations"] if g["mode"] == "eagle"]
    ar = {(g["prompt"], str(g["chat"])): g["tokens"] for g in vectors["bundles"][0]["generations"]
          if g["mode"] == "ar" and not g["sampling"]}  # fmt: skip
    for g in eagle:  # lossless: greedy is ar's
        if not g["sampling"]:
            assert g["tokens"] == ar[(g["prompt"], str(g["chat"]))], g
    assert {g["drafter"] for g in eagle} == {None, "lookup+eagle"}
    assert all(g["drafted"] > 0 for g in eagle if g["policy"] != "auto")
    assert any(g["accepted"] > 0 for g in eagle)  # kept drafts: the head's cache recomputed
    assert any(g["accepted"] < g["drafted"] for g in eagle)


def test_js_feature_head_chats_keep_their_caches_as_python_does(eagle_conformance):
    same_chats(*eagle_conformance)


def test_js_feature_head_abort_ends_a_stream_and_the_model_goes_on(eagle_conformance):
    _, js = eagle_conformance
    assert js["abort"] == {"error": "AbortError", "chunks": 1, "same": True}


def test_js_refuses_a_head_where_the_bundle_has_none(js_bundles):
    run = cli("generate", str(js_bundles["chat"]), "-p", "hi", "--mode", "eagle")
    assert run.returncode == 2 and "no 'eagle' graph" in run.stderr, run.stderr
    assert "edgespec distill" in run.stderr and "at " not in run.stderr


def test_js_refuses_a_drafter_the_mode_has_not(eagle_bundle):
    run = cli("generate", str(eagle_bundle), "-p", "hi", "--mode", "eagle", "--drafter", "draft")
    assert run.returncode == 2 and "not one of mode eagle's: eagle, lookup+eagle" in run.stderr
    run = cli("generate", str(eagle_bundle), "-p", "hi", "--mode", "eagle", "--drafter",
              "lookup+eagle", "--max-new-tokens", "6", "--ignore-eos", "--stats")  # fmt: skip
    assert run.returncode == 0 and "6 tokens" in run.stderr, run.stderr
