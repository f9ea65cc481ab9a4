"""Fit Kangaroo-style exit adapters: make head@k's exit logits match the final layer's.

`fit_exit_adapters(hf_model, tokenizer, weights, layers, calibration)` runs the transformers
model once over the calibration text (windows of up to 128 tokens; best: the model's own
replies, `python -m benchmarks.real B --own-text`), keeps the residual stream at each exit layer k
(`hidden_states[k]`, exactly head@k's `hidden` output) and the final layer's normed states
(the teacher's logits are recomputed from them a batch at a time: kept whole they were
tokens x vocabulary floats, gigabytes for a real vocabulary), then fits per k an
`ExitAdapter` (RMSNorm + a linear map, added to the residual stream) in two steps: a ridge
least-squares solve that maps the exit's normed state onto the final one (seconds), then
`steps` Adam steps minimising KL(final softmax || exit softmax) through the model's own
frozen final norm and LM head, from the solve or the plain exit, whichever is closer on
held-out windows (the steps are kept only if they get closer still). It returns per layer
the fit record for the manifest (KL and top-1 agreement with the final layer before, after
the solve and after the steps, on the last tenth of the windows, held out from the fit).
Deterministic for a given seed. Progress goes to `on_progress` (ten lines per adapter, with
the current KL); it never prints.
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
    final: list[torch.Tensor] = []  # the last layer's normed states: the teacher's logits' input
    head = _Head(weights)
    with torch.no_grad():
        for batch in torch.from_numpy(windows).split(8):
            out = hf_model(batch, output_hidden_states=True)
            last = out.hidden_states[-1].float().reshape(-1, out.hidden_states[-1].shape[-1])
            if not final:  # the normed states must give the model's own logits
                _check_teacher(head, last, out.logits.float().reshape(last.shape[0], -1))
            final.append(last)
            for k in layers:
                h = out.hidden_states[k]
                hidden[k].append(h.float().reshape(-1, h.shape[-1]))
    teacher = torch.cat(final)
    split = (len(windows) - held) * windows.shape[1]
    records = {}
    for k in layers:
        h = torch.cat(hidden[k])
        adapter, record = _fit_one(h, teacher, split, weights, k, steps, seed, on_progress)
        weights.exit_adapters[k] = adapter
        records[k] = record | {"calibration": str(calibration), "tokens": int(windows.size)}
    return records


class _Head:
    """The model's final norm and LM head (and output softcap), frozen, as torch ops."""

    def __init__(self, weights: DecoderWeights) -> None:
        import torch

        fn = weights.final_norm
        self.eps, self.cap = fn.eps, weights.final_softcap
        self.head = torch.from_numpy(np.asarray(weights.lm_head, np.float32))
        self.bias = None if weights.lm_head_b is None else torch.from_numpy(weights.lm_head_b)
        self.gamma = torch.from_numpy(np.asarray(fn.gamma, np.float32))
        self.beta = None if fn.beta is None else torch.from_numpy(fn.beta)

    def norm(self, a: Any) -> Any:
        import torch.nn.functional as F

        if self.beta is None:
            return _rms(a, self.gamma, self.eps)
        return F.layer_norm(a, (a.shape[-1],), self.gamma, self.beta, self.eps)

    def logits(self, normed: Any) -> Any:
        """Logits of states after the final norm (the family's output transform applied)."""
        import torch
        import torch.nn.functional as F

        out = F.linear(normed, self.head, self.bias)
        return out if self.cap is None else torch.tanh(out / self.cap) * self.cap

    def unnormed(self, normed: Any) -> Any:
        """What the final norm's input looks like, up to scale: the normed state less the
        norm's shift, over its gain (gains near zero clamped: those dims barely matter)."""
        import torch

        shift = 0 if self.beta is None else self.beta
        g = self.gamma.abs().clamp_min(1e-2 * float(self.gamma.abs().mean())) * self.gamma.sign()
        g = torch.where(g == 0, torch.ones_like(g), g)
        return (normed - shift) / g


def _check_teacher(head: _Head, normed: Any, logits: Any) -> None:
    diff = float((head.logits(normed) - logits).abs().max())
    scale = float(logits.abs().max())
    if diff > 1e-3 * max(scale, 1.0):
        raise ExportError(
            "--fit-exit-adapter: this model's last hidden state does not give its logits "
            f"through its final norm and head (max difference {diff:.3g}); exit adapters are "
            "not supported for it"
        )


def _fit_one(
    h: Any,
    teacher: Any,
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
    fn, head = weights.final_norm, _Head(weights)
    size = h.shape[-1]
    gain = torch.ones(size, requires_grad=True)
    w = torch.zeros(size, size, requires_grad=True)

    def exit_logits(x: torch.Tensor) -> torch.Tensor:
        return head.logits(head.norm(x + _rms(x, gain, fn.eps) @ w))

    def kl(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        lt = F.log_softmax(head.logits(t), -1)
        return F.kl_div(
            F.log_softmax(exit_logits(x), -1), lt, log_target=True, reduction="batchmean"
        )

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            total, agree = 0.0, 0.0
            for x, t in zip(h[split:].split(512), teacher[split:].split(512), strict=True):
                total += float(kl(x, t)) * len(x)
                agree += float((exit_logits(x).argmax(-1) == head.logits(t).argmax(-1)).sum())
            n = len(h) - split
            return total / n, agree / n

    before = evaluate()
    with torch.no_grad():  # the solve: x + x̂·W ≈ r·u, u the final norm's input direction
        x = h[:split]
        r = x.pow(2).mean(-1, keepdim=True).add(fn.eps).sqrt()
        xh = x / r
        u = head.unnormed(teacher[:split])
        u = u / u.pow(2).mean(-1, keepdim=True).add(fn.eps).sqrt()
        gram = xh.T @ xh
        ridge = 1e-2 * float(gram.diagonal().mean())  # a few thousand tokens for an [H, H] map
        w.copy_(torch.linalg.solve(gram + ridge * torch.eye(size), xh.T @ (u - xh)))
    solved = evaluate()
    # the steps start from the better of the solve and the plain exit on held-out windows (a
    # few thousand tokens can overfit an [H, H] map); from the plain exit with a larger rate
    start = solved if solved[0] < before[0] else before
    if start is before:
        with torch.no_grad():
            w.zero_()
    base_lr = 1e-4 if start is solved else 1e-3
    kept = (w.detach().clone(), start)
    opt = torch.optim.Adam([gain, w], lr=base_lr)
    gen = torch.Generator().manual_seed(seed)
    report = max(1, steps // 10)  # ten progress lines per adapter: readable in a log
    batch = min(256, split)
    for step in range(steps):
        idx = torch.randint(0, split, (batch,), generator=gen)
        lr = base_lr * 0.5 * (1 + np.cos(np.pi * step / steps))  # cosine: ends annealed
        for group in opt.param_groups:
            group["lr"] = lr
        loss = kl(h[idx], teacher[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_progress is not None and ((step + 1) % report == 0 or step + 1 == steps):
            on_progress(f"exit adapter @{k}: step {step + 1}/{steps}, kl={loss.item():.3f}")
    after = evaluate()
    if after[0] > kept[1][0]:  # the steps did not help on held-out windows: keep the start
        with torch.no_grad():
            gain.fill_(1.0)
            w.copy_(kept[0])
        after = kept[1]
    adapter = ExitAdapter(
        Norm(gain.detach().numpy().copy(), None, fn.eps), w.detach().numpy().copy()
    )
    record = {
        "kind": "rmsnorm+linear",
        "steps": steps,
        "kl_before": round(before[0], 5),
        "kl_solved": round(solved[0], 5),
        "kl_after": round(after[0], 5),
        "top1_before": round(before[1], 5),
        "top1_solved": round(solved[1], 5),
        "top1_after": round(after[1], 5),
    }
    return adapter, record


def _rms(x: Any, gain: Any, eps: float) -> Any:
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain
