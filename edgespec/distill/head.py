"""The feature head in torch: the eagle graph's computation (export/eagle.py), trainable, with
the unrolled forward its drafting needs.

`FeatureHead(target, head)` holds the head's own weights as parameters and the target's
embeddings, final norm, LM head and rotary table as frozen buffers (from the target's
`DecoderWeights`). `unrolled(ids, features, depth)` runs `depth` passes over windows of the
target's own sequences, pass s standing for draft step s: pass 1 reads the target's features
(position t: features of t, token t + 1), pass s > 1 the state pass s - 1 computed at t - 1,
and attends what drafting step s sees — pass 1's keys up to t - s + 1 and pass k's key at
t - s + k for 2 <= k <= s (EAGLE-3's training-time test). Pass s at t predicts token t + 2.
`weights()` returns the `HeadWeights` the graph is built from. `draft_ids` (optional, int
[N]): the head's draft vocabulary, target ids whose rows of the target's LM head it scores
(`logits` over them, in their order); the graph places them on the target's ids.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edgespec.export.decoder import DecoderWeights, Norm
from edgespec.export.eagle import HeadWeights


def _rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * gamma


class FeatureHead(nn.Module):
    def __init__(
        self, target: DecoderWeights, head: HeadWeights, draft_ids: np.ndarray | None = None
    ) -> None:
        super().__init__()
        a = target.attn
        self.heads, self.kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.scale = a.scale if a.scale is not None else self.head_dim**-0.5
        self.eps = target.final_norm.eps
        self.embed_scale = target.embed_scale
        self.softcap = target.final_softcap
        self.feature_layers = list(head.feature_layers)
        assert target.rotary is not None
        cos, sin = target.rotary
        f32 = lambda a: torch.from_numpy(np.array(a, np.float32))  # noqa: E731
        self.register_buffer("embed", f32(target.embed), persistent=False)
        lm = self.embed if target.tied else f32(target.lm_head)
        self.register_buffer("lm_head", lm, persistent=False)
        self.draft_ids: torch.Tensor | None = None
        if draft_ids is not None:
            self.draft_ids = torch.from_numpy(np.asarray(draft_ids, np.int64))
            self.register_buffer("draft_lm", lm[self.draft_ids].clone(), persistent=False)
        self.register_buffer("final_norm", f32(target.final_norm.gamma), persistent=False)
        self.register_buffer("cos", f32(cos), persistent=False)
        self.register_buffer("sin", f32(sin), persistent=False)
        lw = head.layer
        assert lw.attn_norm is not None and lw.mlp_norm is not None
        p = lambda a: nn.Parameter(f32(a).clone())  # noqa: E731
        self.fuse, self.proj = p(head.fuse), p(head.proj)
        self.embed_norm, self.state_norm = p(head.embed_norm.gamma), p(head.state_norm.gamma)
        self.attn_norm, self.mlp_norm = p(lw.attn_norm.gamma), p(lw.mlp_norm.gamma)
        self.qkv, self.o, self.up, self.down = p(lw.qkv_w), p(lw.o_w), p(lw.up_w), p(lw.down_w)

    # -- one pass -------------------------------------------------------------------------
    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary (rotate-half, the first rotary dims) of x [B, heads, T, d] at positions [T]."""
        cos, sin = self.cos[pos], self.sin[pos]  # [T, r / 2]
        half = cos.shape[-1]
        x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)

    def _input(self, ids: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        e = self.embed[ids] * self.embed_scale
        z = torch.cat([_rms(e, self.embed_norm, self.eps), _rms(g, self.state_norm, self.eps)], -1)
        return z @ self.proj

    def _qkv(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = z.shape
        qkv = _rms(z, self.attn_norm, self.eps) @ self.qkv
        d, h, kv = self.head_dim, self.heads, self.kv_heads
        q, k, v = qkv.split([h * d, kv * d, kv * d], -1)
        q = self._rotate(q.view(b, t, h, d).transpose(1, 2), pos)
        k = self._rotate(k.view(b, t, kv, d).transpose(1, 2), pos)
        v = v.view(b, t, kv, d).transpose(1, 2)
        rep = h // kv
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def _finish(self, z: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn.shape
        z = z + attn.transpose(1, 2).reshape(b, t, -1) @ self.o
        h = _rms(z, self.mlp_norm, self.eps) @ self.up
        gate, up = h.chunk(2, -1)
        return z + (nn.functional.silu(gate) * up) @ self.down

    def logits(self, state: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits from states [..., H]: over the draft vocabulary where the head has
        one (in its order), else over the LM head rows `rows` (None: all)."""
        if self.draft_ids is not None:
            w = self.draft_lm
        else:
            w = self.lm_head if rows is None else self.lm_head[rows]
        out = (_rms(state, self.final_norm, self.eps) @ w.T).float()
        if self.softcap is not None:
            out = self.softcap * torch.tanh(out / self.softcap)
        return out

    # -- the unrolled forward -------------------------------------------------------------
    def unrolled(self, ids: torch.Tensor, features: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """States [B, T, H] of passes 1..depth over windows ids [B, T + 1] (position t's token is
        ids[:, t + 1]) and the target's features [B, T, F] (module doc)."""
        b, t1 = ids.shape
        t = t1 - 1
        pos = torch.arange(t)
        tokens = ids[:, 1:]
        g = features.to(self.fuse.dtype) @ self.fuse
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        states: list[torch.Tensor] = []
        causal = pos[None, :] <= pos[:, None]  # [T (query), T (key)]
        for s in range(1, depth + 1):
            if s > 1:  # the previous pass's state at t - 1
                prev = states[-1]
                g = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1)
            z = self._input(tokens, g)
            q, k, v = self._qkv(z, pos)
            keys.append((k, v))
            # pass 1's keys up to t - s + 1
            k1, v1 = keys[0]
            scores = [(q @ k1.transpose(-1, -2)) * self.scale]
            visible = pos[None, :] <= pos[:, None] - (s - 1) if s > 1 else causal
            scores[0] = scores[0].masked_fill(~visible, float("-inf"))
            values = [v1]
            for kk in range(2, s + 1):  # pass kk's key at t - s + kk (itself at kk = s)
                shift = s - kk
                kx, vx = keys[kk - 1]
                if shift:
                    kx = torch.cat([torch.zeros_like(kx[:, :, :shift]), kx[:, :, :-shift]], 2)
                    vx = torch.cat([torch.zeros_like(vx[:, :, :shift]), vx[:, :, :-shift]], 2)
                diag = (q * kx).sum(-1, keepdim=True) * self.scale  # [B, h, T, 1]
                diag = diag.masked_fill((pos < shift)[None, None, :, None], float("-inf"))
                scores.append(diag)
                values.append(vx)
            w = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)
            attn = w[..., :t] @ values[0]
            for j, vx in enumerate(values[1:]):
                attn = attn + w[..., t + j : t + j + 1] * vx
            states.append(self._finish(z, attn))
        return states

    def weights(self) -> HeadWeights:
        """The head's weights as the graph builder takes them."""
        n = lambda p: Norm(p.detach().float().numpy().copy(), None, self.eps)  # noqa: E731
        a = {
            "feature_layers": np.asarray(self.feature_layers),
            **{k: getattr(self, k).detach().float().numpy().copy()
               for k in ("fuse", "proj", "qkv", "o", "up", "down")},
            "embed_norm": n(self.embed_norm).gamma, "state_norm": n(self.state_norm).gamma,
            "attn_norm": n(self.attn_norm).gamma, "mlp_norm": n(self.mlp_norm).gamma,
        }  # fmt: skip
        if self.draft_ids is not None:
            a["draft_ids"] = self.draft_ids.numpy().copy()
        return HeadWeights.from_arrays(a, self.eps)
