"""Fit Kangaroo-style exit adapters: make head@k's exit logits match the final layer's.

`fit_exit_adapters(hf_model, tokenizer, weights, layers, calibration)` runs the transformers
model once over the calibration text (windows of up to 128 tokens), keeps the residual
stream at each exit layer k (`hidden_states[k]`, exactly head@k's `hidden` output) and the
final layer's logits, then fits per k an `ExitAdapter` (RMSNorm + a linear map, added to the
residual stream; zero-initialised, so training starts from the plain shared-head exit) by
minimising KL(final softmax || exit softmax) through the model's own frozen final norm and
LM head. The adapters go into `weights.exit_adapters`; it returns per layer the fit record
for the manifest (KL and top-1 agreement with the final layer before and after, on the
last tenth of the windows, held out from the fit). Deterministic for a given seed.
Progress goes to `on_progress` (ten lines per adapter, with the current KL); it never prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.decoder import DecoderWeights, ExitAdapter, Norm
from edgespec.export.errors import ExportError

WINDOW = 128
MAX_WINDOWS = 96  # ~12k calibration tokens: plenty for an [H, H] map, minutes on a CPU


def calibration_windows(tokenizer: Any, path: str | Path, max_positions: int) -> np.ndarray:
    """[n, window] token ids cut from the calibration text."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"--fit-exit-adapter {path}: no such file; give a text file")
    text = path.read_text(errors="replace")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    window = min(WINDOW, max_positions)
    n = min(len(ids) // window, MAX_WINDOWS)
    if n < 4:
        raise ExportError(
            f"--fit-exit-adapter {path} is too short ({len(ids)} tokens): give at least "
            f"{4 * window} tokens of text like what the model will generate"
        )
    return np.asarray(ids[: n * window], np.int64).reshape(n, window)


def fit_exit_adapters(
    hf_model: Any,
    tokenizer: Any,
    weights: DecoderWeights,
    layers: list[int],
    calibration: str | Path,
    steps: int = 300,
    seed: int = 0,
    on_progress: Callable[[str], None] | None = None,
) -> dict[int, dict[str, Any]]:
    import torch

    windows = calibration_windows(tokenizer, calibration, hf_model.config.max_position_embeddings)
    held = max(1, len(windows) // 10)
    hidden: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
    teacher: list[torch.Tensor] = []
    with torch.no_grad():
        for batch in torch.from_numpy(windows).split(8):
            out = hf_model(batch, output_hidden_states=True)
            teacher.append(out.logits.float().reshape(-1, out.logits.shape[-1]))
            for k in layers:
                h = out.hidden_states[k]
                hidden[k].append(h.float().reshape(-1, h.shape[-1]))
    logits = torch.cat(teacher)
    split = (len(windows) - held) * windows.shape[1]
    records = {}
    for k in layers:
        h = torch.cat(hidden[k])
        adapter, record = _fit_one(h, logits, split, weights, k, steps, seed, on_progress)
        weights.exit_adapters[k] = adapter
        records[k] = record | {"calibration": str(calibration), "tokens": int(windows.size)}
    return records


def _fit_one(
    h: Any,
    logits: Any,
    split: int,
    weights: DecoderWeights,
    k: int,
    steps: int,
    seed: int,
    on_progress: Callable[[str], None] | None,
) -> tuple[ExitAdapter, dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    fn = weights.final_norm
    head = torch.from_numpy(np.asarray(weights.lm_head, np.float32))
    bias = None if weights.lm_head_b is None else torch.from_numpy(weights.lm_head_b)
    gamma_f = torch.from_numpy(fn.gamma)
    beta_f = None if fn.beta is None else torch.from_numpy(fn.beta)
    size = h.shape[-1]
    gain = torch.ones(size, requires_grad=True)
    w = torch.zeros(size, size, requires_grad=True)

    def exit_logits(x: torch.Tensor) -> torch.Tensor:
        a = x + _rms(x, gain, fn.eps) @ w
        if beta_f is None:
            a = _rms(a, gamma_f, fn.eps)
        else:
            a = F.layer_norm(a, (size,), gamma_f, beta_f, fn.eps)
        out = F.linear(a, head, bias)
        cap = weights.final_softcap  # the family's own output transform, as head@k applies it
        return out if cap is None else torch.tanh(out / cap) * cap

    def kl(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        lt = F.log_softmax(t, -1)
        return F.kl_div(
            F.log_softmax(exit_logits(x), -1), lt, log_target=True, reduction="batchmean"
        )

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            x, t = h[split:], logits[split:]
            agree = (exit_logits(x).argmax(-1) == t.argmax(-1)).float().mean()
            return float(kl(x, t)), float(agree)

    before = evaluate()
    opt = torch.optim.Adam([gain, w], lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    report = max(1, steps // 10)  # ten progress lines per adapter: readable in a log
    batch = min(512, split)
    for step in range(steps):
        idx = torch.randint(0, split, (batch,), generator=gen)
        lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * step / steps))  # cosine: ends annealed
        for group in opt.param_groups:
            group["lr"] = lr
        loss = kl(h[idx], logits[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_progress is not None and ((step + 1) % report == 0 or step + 1 == steps):
            on_progress(f"exit adapter @{k}: step {step + 1}/{steps}, kl={loss.item():.3f}")
    after = evaluate()
    adapter = ExitAdapter(
        Norm(gain.detach().numpy().copy(), None, fn.eps), w.detach().numpy().copy()
    )
    record = {
        "kind": "rmsnorm+linear",
        "steps": steps,
        "kl_before": round(before[0], 5),
        "kl_after": round(after[0], 5),
        "top1_before": round(before[1], 5),
        "top1_after": round(after[1], 5),
    }
    return adapter, record


def _rms(x: Any, gain: Any, eps: float) -> Any:
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain
