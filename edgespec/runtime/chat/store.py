"""Conversations that survive a restart: a `ChatSession`'s caches and tokens in one file.

`save(session, path)` writes the valid positions of the target's KV cache and of each draft
model's cache, the tokens they hold, the messages and the system prompt, with the bundle's
identity and this format's version, to a temporary file beside `path`, flushed to disk, then
renamed over it: a crash mid-write leaves the old file or none, never one that loads wrong.
`load(session, path)` refuses a file of another bundle (the manifest's bytes, and each weight
and graph file's size and first and last 64 KiB), another format version, or a session that
cannot take it (split mode, a server's pool row, caches in device memory), naming what
differs; otherwise the session's caches are as they were, and its next turn prefills only the
tokens past what they hold (a prompt-lookup index is rebuilt from the tokens).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.runtime.drafters.base import Chain, ModelDrafter
from edgespec.runtime.errors import InputError
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.verify.local import LocalVerifier

# the functions take a runtime.chat.session.ChatSession (typed Any: session.py imports this
# module)
ChatSession = Any

FORMAT, VERSION = "edgespec-chat-session", 1
EDGE = 1 << 16  # bytes hashed at each end of every weight and graph file


def bundle_identity(folder: str | os.PathLike, files: list[str]) -> str:
    """A digest of the manifest and of each file's size and first and last bytes."""
    h = hashlib.sha256((Path(folder) / "manifest.json").read_bytes())
    for name in sorted(files):
        path = Path(folder) / name
        size = path.stat().st_size
        h.update(f"{name}:{size}".encode())
        with path.open("rb") as f:
            h.update(f.read(EDGE))
            f.seek(max(size - EDGE, 0))
            h.update(f.read(EDGE))
    return h.hexdigest()


def _identity(session: ChatSession) -> str:
    m = session.manifest
    return bundle_identity(session.folder, [m.weights_file, *(g.file for g in m.graphs)])


def _stacks(session: ChatSession) -> dict[str, Stack]:
    """The caches a session owns, by name: the target's and each draft model's."""
    if not session.local:
        raise InputError("only a local conversation can be saved or loaded (not split mode)")
    v = session.verifier
    if not (isinstance(v, LocalVerifier) and v.target is session.target):
        raise InputError("a conversation whose cache is a server's pool row cannot be saved")
    drafter = session.drafter
    members = drafter.drafters if isinstance(drafter, Chain) else [drafter]
    out = {"target": session.target}
    for i, d in enumerate(members):
        if isinstance(d, ModelDrafter):
            out[f"draft{i}"] = d.model
    for name, stack in out.items():
        if stack.cache is not None and stack.cache.device is not None:
            raise InputError(f"the {name} cache is in device memory: saving it is not supported")
    return out


def save(session: ChatSession, path: str | os.PathLike) -> None:
    arrays: dict[str, np.ndarray] = {}
    lengths = {}
    for name, stack in _stacks(session).items():
        cache, n = stack.cache, stack.length
        lengths[name] = n
        for j, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True) if cache else []):
            arrays[f"{name}.k{j}"], arrays[f"{name}.v{j}"] = k[:, :, :n], v[:, :, :n]
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "bundle": _identity(session),
        "seq": session.seq,
        "lengths": lengths,
        "messages": session.messages,
        "system": session.system,
    }
    write(path, meta, arrays)


def write(path: str | os.PathLike, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Write `meta` (JSON) and `arrays` to `path` atomically: a temporary file beside it,
    flushed to disk, renamed over it. Returns the bytes written."""
    arrays = {**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON part of a file `write` wrote (the arrays are not read)."""
    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())
    if not isinstance(meta, dict):
        raise ValueError("its meta is not a JSON object")
    return meta


def read(path: str | os.PathLike, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, arrays) of a file `write` wrote; an `InputError` naming `what` it should have
    been if it cannot be read whole (a zip member's checksum is checked as it is read)."""
    try:
        with np.load(path) as data:
            meta: dict[str, Any] = json.loads(bytes(data["meta"]).decode())
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path} is not {what} ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path} is not {what} (its meta is not a JSON object)")
    return meta, arrays


def load(session: ChatSession, path: str | os.PathLike) -> None:
    meta, arrays = read(path, "a saved conversation")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InputError(
            f"{path} is format {meta.get('format')} version {meta.get('version')}; this "
            f"edgespec reads {FORMAT} version {VERSION}: save the conversation again"
        )
    if meta["bundle"] != _identity(session):
        raise InputError(
            f"{path} was saved with another bundle (or another version of it) than "
            f"{session.folder}: load it with the bundle it was saved with"
        )
    stacks = _stacks(session)
    if set(meta["lengths"]) != set(stacks):
        raise InputError(
            f"{path} holds caches {sorted(meta['lengths'])} but this session has "
            f"{sorted(stacks)}: load it with the mode it was saved with"
        )
    for name, stack in stacks.items():
        n = meta["lengths"][name]
        stack.reset(min(stack.max_positions, n + 256))  # room for the next turn
        cache = stack.cache
        assert cache is not None
        for j, (k, v) in enumerate(zip(cache.keys, cache.values, strict=True)):
            k[:, :, :n], v[:, :, :n] = arrays[f"{name}.k{j}"], arrays[f"{name}.v{j}"]
        cache.length = n
    session.messages, session.system = meta["messages"], meta["system"]
    session.seq, session.last = [int(t) for t in meta["seq"]], None
