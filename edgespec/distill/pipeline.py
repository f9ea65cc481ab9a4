"""`distill(target, out, config)`: a bundle with a feature head, from a GGUF file, a Hugging Face
folder or a bundle, within a time budget; run again with the same arguments, it resumes.

Steps, each kept in `out` so that a stopped run (Ctrl-C: `KeyboardInterrupt`) loses nothing:
  1. export  the target into `out` with its features declared (`feature_layers`); a bundle
             that declares them is copied (its source model must still be there: the head
             is built against the target's own tensors)
  2. replies the target answers the prompts (data.py, many at a time) until its share of the
             budget is spent or the prompts run out; with the built-in prompts each reply is
             continued as a chat (its reply and a second question, prompts.follow_up),
             answered next; and up to `own_share` of the replies answer prompts the
             target writes itself (own.py): `out/distill/replies/*.npz`
  3. text    the target reads text every machine has (texts.teacher_texts, data.teacher_force)
             for its share of the budget: `out/distill/text/*.npz`, training positions at
             prefill's speed
  4. train   the head (train.py) on both, with a draft vocabulary (the target's most frequent
             next tokens, chosen once and kept in the state) until the budget is spent,
             checkpointed to `out/distill/checkpoint.pt` every `checkpoint_seconds` and
             when interrupted
  5. write   the eagle graph (export/eagle.py) and its record in the manifest
             (`extra["eagle"]`: held-out acceptance, the measured cost of a head step against
             a target step); also done when interrupted, so the bundle always holds the
             latest head
  6. measure decoding instruct prompts with and without the head (measure.py:
             `decode_speedup`, in the record): what a load without a mode reads
Progress goes to `config.on_progress` (`Progress`), never to stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgespec.bundle import MANIFEST, load_manifest, save_manifest
from edgespec.distill import data
from edgespec.distill.measure import decode_speedup, step_cost
from edgespec.distill.own import FIRST, OwnPrompts
from edgespec.distill.prompts import by_kind, conversation_kind, fitting_prompts, read_prompts
from edgespec.distill.texts import teacher_texts
from edgespec.export.errors import ExportError

STATE = "distill"  # the folder in the bundle holding replies, checkpoint and state


@dataclass
class Progress:
    phase: str  # export | replies | text | train | write | done
    seconds: float  # of the budget spent so far (all runs)
    budget: float
    samples: int = 0  # replies generated
    tokens: int = 0  # their tokens (prompt + reply)
    steps: int = 0
    loss: float | None = None
    accepted: float | None = None  # held-out mean drafts kept per round at γ = 4
    message: str = ""
    text_tokens: int = 0  # positions of text the target read (teacher forcing)


@dataclass
class DistillConfig:
    minutes: float = 10.0  # the whole budget: replies and training, over every run
    prompts: Path | None = None  # a JSONL file (prompts.read_prompts); None: the built-in set
    # at most these shares of the budget go to generating replies and to reading text; the
    # rest trains. On SmolLM2 (2 cores, 30 minutes) 0.35 for replies left the head short of
    # steps, 0.25 (loaded) short of replies. Text the target reads trained worse than replies
    # (400 steps, sources held out: 1.58 with half the windows from text, 1.66 with none)
    reply_share: float = 0.3
    text_share: float = 0.0
    # with the built-in prompts, at most this share of the replies answer prompts the target
    # writes itself (own.py): on SmolLM2 (400 steps) replies to its own prompts in place of 30%
    # of the built-in ones kept 1.45 tokens a round on prompts outside both sets against 1.24
    own_share: float = 0.5
    new_tokens: int = 192  # reply length cap
    feature_layers: tuple[int, ...] | None = None  # None: a low, a middle and the last layer
    threads: int | None = None
    bf16: bool | None = None  # None: where the CPU has AVX-512 BF16
    eval_seconds: float = 120.0  # between held-out evaluations (each costs a few steps)
    checkpoint_seconds: float = 60.0
    train: Any = None  # a train.TrainConfig (None: its defaults)
    on_progress: Callable[[Progress], None] | None = None


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's choice: a low, a middle and the last layer."""
    return tuple(sorted({min(2, num_layers), max(1, num_layers // 2), num_layers}))


def distill(target: str | os.PathLike, out: str | os.PathLike, config: DistillConfig) -> dict:
    """Make or resume the bundle `out` with a feature head for `target`; return its record."""
    import numpy as np
    import torch

    from edgespec.distill.head import FeatureHead
    from edgespec.distill.train import TrainConfig, Trainer, coverage, draft_vocabulary
    from edgespec.export.eagle import initial_head
    from edgespec.runtime.model import Model

    c = config
    out, budget = Path(out), c.minutes * 60.0
    if c.minutes <= 0:
        raise ExportError(f"--minutes {c.minutes:g}: give a budget above 0")
    conversations = (
        read_prompts(c.prompts)
        if c.prompts is not None
        else [[{"role": "user", "content": p}] for p in by_kind(fitting_prompts())]
    )
    state_dir = out / STATE
    state = _state(state_dir)
    report = c.on_progress or (lambda _: None)
    if state is None:
        report(Progress("export", 0.0, budget, message=f"exporting {target}"))
        state = _export(Path(target), out, c)
        _save_state(state_dir, state)
    elif state["target"] != str(Path(target).expanduser().resolve()):
        raise ExportError(
            f"--out {out} holds a distill of {state['target']}, not of {target}: choose a new "
            "folder, or give the same target to resume"
        )
    spent = float(state.get("seconds", 0.0))
    start = time.monotonic()

    def elapsed() -> float:
        return spent + time.monotonic() - start

    weights = _target_weights(state["source"])
    if c.threads:
        torch.set_num_threads(c.threads)
    model = Model.load(out, mode="lookup", threads=c.threads)
    replies = state_dir / "replies"
    counts = {"samples": len(list(replies.glob("[0-9]*.npz"))) if replies.exists() else 0}
    counts["tokens"] = int(state.get("tokens", 0))

    def on_sample(s: data.Sample) -> None:
        counts["samples"] += 1
        counts["tokens"] += len(s.ids)
        report(Progress("replies", elapsed(), budget, counts["samples"], counts["tokens"]))
        state.update(seconds=elapsed(), tokens=counts["tokens"])
        _save_state(state_dir, state)

    reply_end = start + max(0.0, c.reply_share * budget - spent)
    made = [int(p.stem) for p in replies.glob("[0-9]*.npz")] if replies.exists() else []
    own = OwnPrompts.of(model, c.own_share, made) if c.prompts is None else None
    try:
        data.generate(
            model,
            conversations,
            replies,
            reply_end,
            c.new_tokens,
            on_sample,
            follow=data.chats_after(model, conversations) if c.prompts is None else None,
            own=own,
        )
    finally:
        state.update(seconds=elapsed(), tokens=counts["tokens"])
        _save_state(state_dir, state)
    texts = state_dir / "text"
    text_end = start + max(0.0, (c.reply_share + c.text_share) * budget - spent)
    counts["text"] = int(state.get("text_tokens", 0))

    def on_text(s: data.Sample) -> None:
        counts["text"] += len(s.ids)
        report(Progress("text", elapsed(), budget, counts["samples"], counts["tokens"],
                        text_tokens=counts["text"]))  # fmt: skip
        state.update(seconds=elapsed(), text_tokens=counts["text"])
        _save_state(state_dir, state)

    if c.text_share > 0:  # at least one text (none again when resumed past its share)
        try:
            data.teacher_force(model, teacher_texts(), texts, text_end, c.new_tokens, on_text)
        finally:
            state.update(seconds=elapsed(), text_tokens=counts["text"])
            _save_state(state_dir, state)
    text = data.load(texts) if texts.exists() else []
    samples = data.load(replies)
    if "held_out" not in state:  # chosen once: a resumed run holds out the same replies
        state["held_out"] = data.held_out_indices(conversations, built_in=c.prompts is None)
    train_set, held = data.split(samples, state["held_out"])
    held = held or train_set[-1:]
    if not train_set:
        raise ExportError(
            "no replies to train on: the budget ended before the first reply; give more "
            "--minutes (or shorter prompts)"
        )

    bf16 = c.bf16 if c.bf16 is not None else _has_bf16()
    tc = replace(c.train or TrainConfig(), bf16=bf16)
    ckpt = state_dir / "checkpoint.pt"
    record: dict[str, Any] = dict(state.get("record", {}))
    # the draft vocabulary: chosen once, from the replies there when training first starts
    if "draft_ids" not in state or not ckpt.exists():
        vocab = weights.embed.shape[0]
        ids = (draft_vocabulary(train_set + text, tc.draft_vocab, vocab)
               if 0 < tc.draft_vocab < vocab else None)  # fmt: skip
        state["draft_ids"] = None if ids is None else [int(i) for i in ids]
    draft_ids = None if state["draft_ids"] is None else np.asarray(state["draft_ids"], np.int64)
    if draft_ids is not None:
        record.update(draft_vocab=len(draft_ids), coverage=coverage(held, draft_ids))
    head = FeatureHead(weights, initial_head(weights, state["feature_layers"]), draft_ids)
    trainer = Trainer(head, train_set, held, tc, text)
    if ckpt.exists():
        trainer.load_state(torch.load(ckpt, weights_only=False))
    losses: list[float] = []
    last_eval = last_save = time.monotonic()

    def save() -> None:
        torch.save(trainer.state(), str(ckpt) + ".tmp")
        os.replace(str(ckpt) + ".tmp", ckpt)
        state.update(seconds=elapsed(), record=record)
        _save_state(state_dir, state)

    try:
        first = trainer.steps
        while elapsed() < budget or trainer.steps == first:  # at least one step a run
            losses.append(trainer.step(elapsed() / budget))
            now = time.monotonic()
            if now - last_eval > c.eval_seconds:
                record["held_out"] = trainer.evaluate(tc.eval_tokens)
                last_eval = now
            if now - last_save > c.checkpoint_seconds:
                save()
                last_save = now
            report(Progress("train", elapsed(), budget, counts["samples"], counts["tokens"],
                            trainer.steps, sum(losses[-20:]) / len(losses[-20:]),
                            record.get("held_out", {}).get("accepted"),
                            text_tokens=counts["text"]))  # fmt: skip
        record["held_out"] = trainer.evaluate(tokens=None, full_vocab=True)
        kinds: dict[str, list[data.Sample]] = {}
        n = len(conversations)
        for s in held:  # past the conversations: a chat (data.chats_after), an own prompt
            kind = ("own" if s.index >= FIRST else "chat" if s.index >= n
                    else conversation_kind(conversations[s.index]))  # fmt: skip
            kinds.setdefault(kind, []).append(s)
        record["held_out_by_kind"] = {
            k: trainer.evaluate(tokens=None, full_vocab=True, samples=v) for k, v in kinds.items()
        }
    finally:
        save()
        report(Progress("write", elapsed(), budget, counts["samples"], counts["tokens"],
                        trainer.steps, message="writing the head into the bundle"))  # fmt: skip
        record.update(
            feature_layers=list(state["feature_layers"]),
            steps=trainer.steps,
            samples=len(samples),
            train_tokens=int(sum(len(s.ids) for s in train_set)),
            text_tokens=int(sum(len(s.ids) for s in text)),
            minutes=round(elapsed() / 60, 2),
        )
        _write(out, weights, trainer.head, record)
    record["step_cost"] = step_cost(out)
    report(Progress("write", elapsed(), budget, counts["samples"], counts["tokens"],
                    trainer.steps, message="timing decoding with, without the head"))  # fmt: skip
    record["decode_speedup"] = decode_speedup(out, c.threads)
    _write_record(out, record)
    state.update(record=record)
    _save_state(state_dir, state)
    report(Progress("done", elapsed(), budget, counts["samples"], counts["tokens"],
                    trainer.steps, accepted=record["held_out"].get("accepted")))  # fmt: skip
    return record


# -- steps --------------------------------------------------------------------------------
def _state(folder: Path) -> dict | None:
    path = folder / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def _save_state(folder: Path, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, folder / "state.json")


def _export(target: Path, out: Path, c: DistillConfig) -> dict:
    """Step 1: `out` as a bundle of `target` with its features declared; the state to keep."""
    from edgespec.export import export_bundle
    from edgespec.export.gguf_export import is_gguf

    target = target.expanduser()
    if out.exists() and any(out.iterdir()):
        raise ExportError(
            f"--out {out} is not empty and holds no distill to resume: choose a new folder"
        )
    if (target / MANIFEST).exists():  # a bundle: it must declare its features already
        manifest = load_manifest(target)
        if not manifest.feature_layers:
            raise ExportError(
                f"bundle {target} declares no features: distill from its model file "
                f"({manifest.source.get('model')}) instead, or re-export it with "
                "--feature-layers"
            )
        source = str(manifest.source.get("model"))
        if not Path(source).expanduser().exists():
            raise ExportError(
                f"bundle {target} was exported from {source}, which is not here: the head is "
                "built against the target's own tensors; distill from the model file"
            )
        if out.resolve() != target.resolve():
            shutil.copytree(target, out, dirs_exist_ok=True)
        layers = manifest.feature_layers
    else:
        if not (is_gguf(target) or (target / "config.json").exists()):
            raise ExportError(
                f"{target} is neither a GGUF file, a Hugging Face model folder nor a bundle"
            )
        source = str(target.resolve())
        layers = list(c.feature_layers or default_feature_layers(_num_layers(target)))
        export_bundle(target, out, feature_layers=layers)
    return {"target": str(target.resolve()), "source": str(Path(source).expanduser().resolve()),
            "feature_layers": [int(k) for k in layers], "seconds": 0.0}  # fmt: skip


def _num_layers(target: Path) -> int:
    from edgespec.export.gguf_export import is_gguf

    if is_gguf(target):
        from edgespec.export.gguf_model import read_gguf

        return read_gguf(target).info.num_layers
    config = json.loads((target / "config.json").read_text())
    return int(config.get("num_hidden_layers") or config["n_layer"])


def _target_weights(source: str) -> Any:
    """The target's `DecoderWeights` (its embeddings, final norm, LM head, rotary table)."""
    from edgespec.export.gguf_export import is_gguf

    path = Path(source)
    if is_gguf(path):
        from edgespec.export.gguf_model import read_gguf

        return read_gguf(path).weights
    try:
        from edgespec.export.hf import extract, load_checkpoint
    except ImportError:  # pragma: no cover - the [export] extra is missing
        raise ExportError(
            "distilling a Hugging Face model reads it through transformers: "
            "pip install 'edgespec[export,distill]'"
        ) from None
    return extract(load_checkpoint(str(path), None)[0])


def _write(out: Path, weights: Any, head: Any, record: dict) -> None:
    """Step 4: the eagle graph and its manifest entry (replacing an earlier head)."""
    from edgespec.export.eagle import HEAD_QUANTIZE, write_head

    manifest = load_manifest(out)
    full = manifest.graph("full")
    batched = any(t.name == "query_seqlens" for t in full.inputs)
    level = int(manifest.extra.get("accuracy_level", 4))
    shared = manifest.quantization if manifest.quantization in ("int8", "int4") else None
    graph = write_head(out, weights, head.weights(), manifest.dtype, batched, level,
                       HEAD_QUANTIZE, shared)  # fmt: skip
    manifest.graphs = [g for g in manifest.graphs if g.role != "eagle"] + [graph]
    manifest.extra["eagle"] = record
    save_manifest(manifest, out)


def _write_record(out: Path, record: dict) -> None:
    manifest = load_manifest(out)
    manifest.extra["eagle"] = record
    save_manifest(manifest, out)


def _has_bf16() -> bool:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags"))  # fmt: skip
    except (OSError, StopIteration):
        return False
    return "avx512_bf16" in flags.split()


__all__ = ["DistillConfig", "Progress", "distill"]
