"""The server's prefix cache on disk (`edgespec serve B --cache-dir DIR --cache-bytes N`).

Takes a folder, a byte budget, the bundle's identity (`chat.store.bundle_identity`) and the
KV layout of each cache a conversation owns (the target's pool row, a draft model's cache).
A file holds the first positions of those caches for one token prefix, in chat_store's
format (arrays + JSON meta, written to a temporary file, flushed, renamed over its name), and
is named by the digest of its tokens. `store` queues a snapshot for the writer thread;
`lookup` finds the file sharing the longest prefix with a prompt and reads it whole.

Guarantees:
- bounded: the files of this bundle hold at most `budget` bytes; the least recently used go
  first (use is a file's mtime, so the order survives a restart); a snapshot that alone is
  over the budget is not written. A new file replaces those whose tokens are a prefix of its
  own (the conversation's earlier turns).
- atomic: a crash mid-write leaves the old file or none, never one that loads wrong.
- by name: a file of another bundle (or another version of it), another format or version
  is never loaded, never deleted (another server may use it) and never counted in the
  budget; a file that cannot be read whole (a bad checksum, cut short, wrong shapes) is never
  loaded either. Each is named with its reason in the log, once, and counted in `report()`.
- concurrent: the index is behind a lock; one writer thread writes in order; a file that
  vanishes between lookup and read (evicted, replaced) is a miss.
- nothing lost: `close()` writes what is still queued before it returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.runtime.chat import store as chat_store
from edgespec.runtime.chat.session import common_prefix
from edgespec.runtime.errors import InputError

log = logging.getLogger("edgespec.serve")

FORMAT, VERSION = "edgespec-prefix-cache", 1
QUEUED = 4  # snapshots waiting for the writer before `store` waits (bounds their memory)
NAMED = 20  # ignored files named in the report


class CacheDirError(EdgespecError, ValueError):
    """--cache-dir cannot be used (not a folder, not writable)."""


@dataclass(frozen=True)
class Layout:
    """One cache's shape: its layers' count, and per position kv_heads x head_dim of dtype."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str


@dataclass
class Entry:
    name: str
    tokens: tuple[int, ...]
    size: int
    used: float  # the file's mtime: its last use


@dataclass
class Hit:
    """A file's caches for its first `length` tokens: arrays[name] = [(k, v)] per layer,
    each [kv_heads, positions, head_dim] (the positions a cache of that name held)."""

    tokens: list[int]
    arrays: dict[str, list[tuple[np.ndarray, np.ndarray]]]
    length: int  # tokens shared with the prompt


@dataclass
class Snapshot:
    tokens: list[int]
    arrays: dict[str, list[tuple[np.ndarray, np.ndarray]]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for kv in self.arrays.values() for k, v in kv)


@dataclass
class Counts:
    hits: int = 0
    misses: int = 0
    positions_restored: int = 0
    writes: int = 0
    bytes_written: int = 0
    evictions: int = 0
    replaced: int = 0
    too_large: int = 0
    write_errors: int = 0
    ignored: dict[str, str] = field(default_factory=dict)  # file name -> why


def name_of(tokens: list[int] | tuple[int, ...]) -> str:
    return hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).hexdigest()[:40] + ".npz"


class PrefixCache:
    def __init__(
        self,
        folder: str | os.PathLike,
        budget: int,
        identity: str,
        layouts: dict[str, Layout],
        min_tokens: int = 64,
    ) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise CacheDirError(
                f"--cache-dir {folder}: cannot write there ({e.strerror or e}): give a folder "
                "this server may create and write"
            ) from None
        self.budget, self.identity, self.layouts = budget, identity, layouts
        self.min_tokens = min_tokens
        self.lock = threading.Condition()
        self.entries: dict[str, Entry] = {}
        self.counts = Counts()
        self.queue: deque[Snapshot] = deque()
        self.writing = False
        self.closed = False
        self._scan()
        self.writer = threading.Thread(target=self._write_loop, name="edgespec-cache", daemon=True)
        self.writer.start()

    # -- index ------------------------------------------------------------------------------
    def _scan(self) -> None:
        for path in sorted(self.folder.glob("*.npz")):
            if path.name.startswith("."):
                continue  # a temporary file of a write that did not finish
            try:
                meta = chat_store.read_meta(path)
                stat = path.stat()
            except Exception as e:  # whatever a damaged zip raises: never loaded
                self._ignore(path.name, f"unreadable ({type(e).__name__}: {e})")
                continue
            why = self._foreign(meta)
            if why:
                self._ignore(path.name, why)
                continue
            tokens = tuple(int(t) for t in meta["tokens"])
            self.entries[path.name] = Entry(path.name, tokens, stat.st_size, stat.st_mtime)
        with self.lock:
            self._evict(keep=None)

    def _foreign(self, meta: dict[str, Any]) -> str | None:
        if meta.get("format") != FORMAT:
            return f"not a prefix-cache file (format {meta.get('format')!r})"
        if meta.get("version") != VERSION:
            return f"format version {meta.get('version')!r}, this server reads {VERSION}"
        if meta.get("bundle") != self.identity:
            return "written for another bundle (or another version of it)"
        if not isinstance(meta.get("tokens"), list) or not isinstance(meta.get("stacks"), dict):
            return "its meta lacks tokens or stacks"
        return None

    def _ignore(self, name: str, why: str) -> None:
        if name not in self.counts.ignored:
            log.warning("prefix cache: ignoring %s: %s", self.folder / name, why)
        self.counts.ignored[name] = why

    def _evict(self, keep: str | None) -> None:
        """Delete the least recently used files until the budget holds (the caller holds
        the lock); `keep` (just written) goes last."""
        while self.bytes > self.budget:
            victims = [e for e in self.entries.values() if e.name != keep]
            if not victims:
                return
            victim = min(victims, key=lambda e: e.used)
            self._drop(victim)
            self.counts.evictions += 1

    def _drop(self, entry: Entry) -> None:
        self.entries.pop(entry.name, None)
        (self.folder / entry.name).unlink(missing_ok=True)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries.values())

    # -- lookup -----------------------------------------------------------------------------
    def lookup(self, ids: list[int], better_than: int) -> Hit | None:
        """The file sharing the longest prefix with `ids` (at least min_tokens, more than
        `better_than`), read whole and checked; None if there is none."""
        while True:
            with self.lock:
                best, length = None, max(better_than, self.min_tokens - 1)
                for e in self.entries.values():
                    n = common_prefix(e.tokens, ids)
                    if n > length:
                        best, length = e, n
                if best is None:
                    self.counts.misses += 1
                    return None
            hit = self._read(best, length)
            if hit is not None:
                return hit
            # unreadable: dropped from the index by _read, try the next best

    def _read(self, entry: Entry, length: int) -> Hit | None:
        path = self.folder / entry.name
        try:
            meta, arrays = chat_store.read(path, "a prefix-cache file")
            why = self._foreign(meta) or self._shapes(meta, arrays)
        except InputError as e:
            why = str(e) if path.exists() else "gone"
        with self.lock:
            if why is not None:
                if self.entries.get(entry.name) is entry:
                    del self.entries[entry.name]
                if why != "gone":
                    self._ignore(entry.name, why)
                return None
            now = time.time()
            entry.used = now
            with contextlib.suppress(OSError):  # its use survives a restart
                os.utime(path, (now, now))
            self.counts.hits += 1
            self.counts.positions_restored += length
        stacks = {
            name: [(arrays[f"{name}.k{j}"], arrays[f"{name}.v{j}"]) for j in range(lay.layers)]
            for name, lay in self.layouts.items()
            if name in meta["stacks"]
        }
        return Hit([int(t) for t in meta["tokens"]], stacks, length)

    def _shapes(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str | None:
        n = len(meta["tokens"])
        if "target" not in meta["stacks"]:
            return "it holds no target cache"
        for name, length in meta["stacks"].items():
            lay = self.layouts.get(name)
            if lay is None:
                continue  # a cache this server's mode does not have (its drafter prefills)
            want = (lay.kv_heads, length, lay.head_dim)
            if not isinstance(length, int) or not 0 < length <= n:
                return f"its {name} cache holds {length!r} positions of {n} tokens"
            for j in range(lay.layers):
                for part in ("k", "v"):
                    a = arrays.get(f"{name}.{part}{j}")
                    if a is None or a.shape != want or str(a.dtype) != lay.dtype:
                        got = None if a is None else (a.shape, str(a.dtype))
                        return f"its {name}.{part}{j} is {got}, this server's is {want, lay.dtype}"
        return None

    # -- store ------------------------------------------------------------------------------
    def wants(self, tokens: list[int]) -> bool:
        """Whether a snapshot of these tokens would add enough: at least min_tokens, not held
        by a file whose tokens start with them, and at least min_tokens past any file it would
        replace (a conversation is not rewritten for every few tokens it grows)."""
        if len(tokens) < self.min_tokens:
            return False
        with self.lock:
            for e in self.entries.values():
                n = common_prefix(e.tokens, tokens)
                if n == len(tokens) or (n == len(e.tokens) and len(tokens) - n < self.min_tokens):
                    return False
            return True

    def store(self, snap: Snapshot) -> None:
        """Queue a snapshot for the writer (waits while QUEUED are queued)."""
        with self.lock:
            if self.closed:
                return
            # a queued snapshot of a prefix of these tokens is superseded
            keep = [s for s in self.queue if common_prefix(s.tokens, snap.tokens) < len(s.tokens)]
            self.queue = deque(keep)
            while len(self.queue) >= QUEUED and not self.closed:
                self.lock.wait()
            self.queue.append(snap)
            self.lock.notify_all()

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self.writer.join(timeout=120)

    def _write_loop(self) -> None:
        while True:
            with self.lock:
                while not self.queue and not self.closed:
                    self.lock.wait()
                if not self.queue:
                    return
                snap = self.queue.popleft()
                self.writing = True
                self.lock.notify_all()
            try:
                self._write(snap)
            except Exception:  # a full disk, a removed folder: the server goes on without it
                log.exception("prefix cache: writing a snapshot failed")
                with self.lock:
                    self.counts.write_errors += 1
            finally:
                with self.lock:
                    self.writing = False
                    self.lock.notify_all()

    def _write(self, snap: Snapshot) -> None:
        if snap.nbytes > self.budget:
            with self.lock:
                self.counts.too_large += 1
            log.warning(
                "prefix cache: a %d-token prefix (%d bytes) is over --cache-bytes %d: not kept",
                len(snap.tokens),
                snap.nbytes,
                self.budget,
            )
            return
        name = name_of(snap.tokens)
        arrays = {}
        for stack, layers in snap.arrays.items():
            for j, (k, v) in enumerate(layers):
                arrays[f"{stack}.k{j}"], arrays[f"{stack}.v{j}"] = k, v
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "bundle": self.identity,
            "tokens": snap.tokens,
            "stacks": {s: int(layers[0][0].shape[1]) for s, layers in snap.arrays.items()},
        }
        size = chat_store.write(self.folder / name, meta, arrays)
        tokens = tuple(snap.tokens)
        with self.lock:
            for e in list(self.entries.values()):  # files of a prefix of these tokens
                if (
                    e.name != name
                    and len(e.tokens) < len(tokens)
                    and common_prefix(e.tokens, snap.tokens) == len(e.tokens)
                ):
                    self._drop(e)
                    self.counts.replaced += 1
            self.entries[name] = Entry(name, tokens, size, time.time())
            self.counts.writes += 1
            self.counts.bytes_written += size
            self._evict(keep=name)

    def flush(self) -> None:
        """Wait until every queued snapshot is written (for tests and shutdown)."""
        with self.lock:
            while self.queue or self.writing:
                self.lock.wait()

    def report(self) -> dict[str, Any]:
        with self.lock:
            c = self.counts
            return {
                "dir": str(self.folder),
                "entries": len(self.entries),
                "bytes": self.bytes,
                "budget": self.budget,
                "hits": c.hits,
                "misses": c.misses,
                "positions_restored": c.positions_restored,
                "writes": c.writes,
                "bytes_written": c.bytes_written,
                "evictions": c.evictions,
                "replaced": c.replaced,
                "too_large": c.too_large,
                "write_errors": c.write_errors,
                "queued": len(self.queue),
                "ignored": len(c.ignored),
                "ignored_files": dict(list(c.ignored.items())[:NAMED]),
            }
