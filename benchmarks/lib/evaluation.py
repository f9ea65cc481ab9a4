"""The trained pair's architectures, evaluation and checkpoints: held-out cross-entropy and
top-1 of the target, its exits and the draft; the greedy path and the tokens per round
greedy speculative decoding would get from exactly those matches
(`benchmarks/train_models.py` reports them).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


from benchmarks.lib.corpus import VOCAB_SIZE, write_json

COMMON_ARCH: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "head_dim": 64,  # edgespec's attention kernel needs a multiple of 16
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
TARGET_ARCH: dict[str, Any] = {
    **COMMON_ARCH,
    "hidden_size": 320,
    "num_hidden_layers": 8,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "intermediate_size": 1024,
}
DRAFT_ARCH: dict[str, Any] = {
    **COMMON_ARCH,
    "hidden_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "intermediate_size": 512,
}


EXIT_WEIGHTS = {2: 0.4, 4: 0.4}  # early-exit layer -> weight of its CE in the target's loss
EVAL_NEW_TOKENS = 64
EVAL_GAMMA = 4  # draft length of the simulated speculative rounds


def _inference_mode(fn: Any) -> Any:
    """`torch.inference_mode()` with torch imported at the call (importing lib loads no torch)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run


def exit_logits(model: LlamaForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """Early-exit logits: the model's own final norm and LM head on an intermediate state."""
    return model.lm_head(model.model.norm(hidden))


def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# ---------------------------------------------------------------------------- evaluation
def heldout_windows(data: np.ndarray, seq_len: int, count: int = 64) -> torch.Tensor:
    """`count` evenly spaced held-out windows of seq_len + 1 ids (fixed for every run)."""
    import numpy as np
    import torch

    count = min(count, len(data) // (seq_len + 1))
    starts = np.linspace(0, len(data) - seq_len - 1, count).astype(np.int64)
    return torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts]))


@_inference_mode
def eval_target(model: LlamaForCausalLM, windows: torch.Tensor) -> dict[str, float]:
    """Held-out CE per exit and each exit's top-1 agreement with the final head."""
    sums: dict[str, float] = {}
    for batch in windows.split(8):
        inputs, labels = batch[:, :-1], batch[:, 1:]
        out = model(input_ids=inputs, output_hidden_states=True)
        final = out.logits.argmax(-1)
        heads = {"final": out.logits}
        for layer in EXIT_WEIGHTS:
            heads[f"exit{layer}"] = exit_logits(model, out.hidden_states[layer])
        for key, logits in heads.items():
            sums[f"loss_{key}"] = sums.get(f"loss_{key}", 0.0) + ce(logits, labels).item()
            if key != "final":
                agree = (logits.argmax(-1) == final).float().mean().item()
                sums[f"top1_agree_{key}"] = sums.get(f"top1_agree_{key}", 0.0) + agree
    n = len(windows.split(8))
    return {k: round(v / n, 4) for k, v in sums.items()}


@_inference_mode
def eval_draft(
    draft: LlamaForCausalLM, target: LlamaForCausalLM, windows: torch.Tensor
) -> dict[str, float]:
    """Held-out CE, KL to the target and top-1 agreement with the target (teacher forced)."""
    import torch.nn.functional as F

    sums = {"loss_ce": 0.0, "kl_to_target": 0.0, "top1_agree_target": 0.0}
    for batch in windows.split(8):
        inputs, labels = batch[:, :-1], batch[:, 1:]
        t_logits = target(input_ids=inputs).logits
        d_logits = draft(input_ids=inputs).logits
        sums["loss_ce"] += ce(d_logits, labels).item()
        sums["kl_to_target"] += F.kl_div(
            F.log_softmax(d_logits, -1).flatten(0, 1),
            F.log_softmax(t_logits, -1).flatten(0, 1),
            log_target=True,
            reduction="batchmean",
        ).item()
        agree = (d_logits.argmax(-1) == t_logits.argmax(-1)).float().mean().item()
        sums["top1_agree_target"] += agree
    n = len(windows.split(8))
    return {k: round(v / n, 4) for k, v in sums.items()}


@_inference_mode
def greedy_path(model: LlamaForCausalLM, ids: list[int], new_tokens: int) -> list[int]:
    """The target's own greedy continuation (KV-cached, never stops at EOS)."""
    import torch

    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    generated: list[int] = []
    for _ in range(new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        generated.append(nxt)
        out = model(
            input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True
        )
    return generated


def tokens_per_round(matches: list[bool], gamma: int) -> float:
    """Tokens per verification of greedy speculative decoding with a fixed draft length.

    Along the target's greedy path the drafter proposes exactly the tokens it predicts there
    while it agrees, so a round accepts the leading run of matches (at most gamma) and adds
    the target's own next token.
    """
    pos = rounds = 0
    while pos < len(matches):
        run = 0
        while run < gamma and pos + run < len(matches) and matches[pos + run]:
            run += 1
        pos += run + 1
        rounds += 1
    return len(matches) / max(rounds, 1)


@_inference_mode
def acceptance(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM,
    tok: PreTrainedTokenizerFast,
    prompts: list[dict[str, Any]],
) -> dict[str, float]:
    """Agreement of the draft and the early exits with the target along its greedy path."""
    import numpy as np
    import torch

    matches: dict[str, list[bool]] = {"draft": [], **{f"exit{e}": [] for e in EXIT_WEIGHTS}}
    rounds: dict[str, list[float]] = {k: [] for k in matches}
    for prompt in prompts:
        ids = tok.encode(prompt["prompt"])
        path = greedy_path(target, ids, EVAL_NEW_TOKENS)
        full = torch.tensor([ids + path[:-1]])
        positions = slice(len(ids) - 1, len(ids) - 1 + len(path))
        want = torch.tensor(path)
        out = target(input_ids=full, output_hidden_states=True)
        preds = {"draft": draft(input_ids=full).logits[0, positions].argmax(-1)}
        for layer in EXIT_WEIGHTS:
            hidden = out.hidden_states[layer][0, positions]
            preds[f"exit{layer}"] = exit_logits(target, hidden).argmax(-1)
        for key, pred in preds.items():
            hits = (pred == want).tolist()
            matches[key].extend(hits)
            rounds[key].append(tokens_per_round(hits, EVAL_GAMMA))
    result: dict[str, float] = {}
    for key in matches:
        result[f"agree_{key}"] = round(float(np.mean(matches[key])), 4)
        result[f"tokens_per_round_g{EVAL_GAMMA}_{key}"] = round(float(np.mean(rounds[key])), 3)
    return result


# ------------------------------------------------------------------------------- caching
def save_checkpoint(
    folder: Path, model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, info: dict[str, Any]
) -> None:
    """Model + tokenizer files, then train_info.json last (it marks the folder complete)."""
    (folder / "train_info.json").unlink(missing_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    write_json(folder / "train_info.json", info)


def new_model(arch: dict[str, Any], seed: int) -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**arch)).float()
