"""A conversation's caches to and from the prefix cache on disk (`serve.prefix_cache`).

Takes an OpenAI conversation of the chat engine: a `ChatSession` whose verifier is a
`PoolVerifier` (its target cache is a row of the server's KV pool) and whose drafter may own
model caches (the draft graph's, head@k's). `snapshot` copies the positions they hold —
the row on the worker thread, after the rounds of the request that just ended — with the
tokens those positions are; `restore` puts a file's positions back and tells the session
its caches hold those tokens, so its next prompt prefills only the tokens past them.
Called only while the conversation's slot is busy with one request (its own thread): no
round of it is in flight, and no other request touches its caches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.runtime.drafters.base import Chain, ModelDrafter
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.stack import Stack
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.prefix_cache import Hit, Layout, Snapshot

ChatSession = Any  # runtime.chat.session.ChatSession with a PoolVerifier (see the module docstring)
Arrays = list[tuple[np.ndarray, np.ndarray]]


def drafter_stacks(session: ChatSession) -> dict[str, Stack]:
    """The drafter's model caches in host memory, by their graphs' roles ("draft", "head@2")."""
    d = session.drafter
    members = d.drafters if isinstance(d, Chain) else [d]
    out = {}
    for m in members:
        first = m.model.stages[0] if isinstance(m, ModelDrafter) else None
        # caches in device memory (or in a Core ML model's state) are not kept
        if first is not None and not first.holds_kv and first.kv_device is None:
            out["+".join(s.graph.role for s in m.model.stages)] = m.model
    return out


def layouts(session: ChatSession, pool: KVPool) -> dict[str, Layout]:
    k = pool.keys[0]
    out = {"target": Layout(len(pool.layers), k.shape[1], k.shape[3], str(k.dtype))}
    for name, stack in drafter_stacks(session).items():
        m = stack.model
        dtype = str(np.dtype(stack.stages[0].kv_dtype))
        out[name] = Layout(len(stack.layers), m.num_kv_heads, m.head_dim, dtype)
    return out


def _row(pool: KVPool, slot: int, most: int) -> Arrays:
    n = min(int(pool.lengths[slot]), most)
    pairs = zip(pool.keys, pool.values, strict=True)
    return [(k[slot, :, :n].copy(), v[slot, :, :n].copy()) for k, v in pairs]


def _fill_row(pool: KVPool, slot: int, arrays: Arrays, n: int) -> None:
    for k, v, (sk, sv) in zip(pool.keys, pool.values, arrays, strict=True):
        k[slot, :, :n], v[slot, :, :n] = sk[:, :n], sv[:, :n]
    pool.lengths[slot] = n


def snapshot(session: ChatSession, wants: Any) -> Snapshot | None:
    """The positions the conversation's caches hold and their tokens; None when `wants`
    (tokens -> bool) declines them or the caches hold nothing."""
    v: PoolVerifier = session.verifier
    seq = list(session.seq)
    n = min(int(v.pool.lengths[v.slot]), len(seq))  # the row's length changes only on the worker
    if n == 0 or not wants(seq[:n]):
        return None
    target = v.worker.post("call", (_row, (v.pool, v.slot, n))).result()
    n = target[0][0].shape[1]
    arrays = {"target": target}
    for name, stack in drafter_stacks(session).items():
        m = min(stack.length, n)
        cache = stack.cache
        if m and cache is not None:
            arrays[name] = [
                (k[0, :, :m].copy(), val[0, :, :m].copy())
                for k, val in zip(cache.keys, cache.values, strict=True)
            ]
    return Snapshot(seq[:n], arrays)


def restore(session: ChatSession, hit: Hit) -> int:
    """Put a file's positions into the conversation's caches (at most the prompt's shared
    length and the row's capacity); returns the positions the target's cache now holds."""
    v: PoolVerifier = session.verifier
    session.seq, session.last = [], None  # trust nothing until the copies are done
    session.drafter.begin([], 1, 0)  # every drafter forgets the last sequence
    n = min(hit.length, v.pool.capacity, hit.arrays["target"][0][0].shape[1])
    v.worker.post("call", (_fill_row, (v.pool, v.slot, hit.arrays["target"], n))).result()
    for name, stack in drafter_stacks(session).items():
        layers = hit.arrays.get(name)
        if not layers:
            continue  # the drafter prefills the whole prompt itself
        m = min(n, layers[0][0].shape[1], stack.max_positions)
        stack.reset(min(stack.max_positions, m + 256))
        cache = stack.cache
        assert cache is not None
        for k, val, (sk, sv) in zip(cache.keys, cache.values, layers, strict=True):
            k[0, :, :m], val[0, :, :m] = sk[:, :m], sv[:, :m]
        cache.length = m
    session.seq = hit.tokens[:n]
    return n
