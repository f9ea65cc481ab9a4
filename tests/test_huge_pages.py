"""Loading a bundle backs its weights with 2 MiB pages where Linux allows it (decode reads
every weight once a token: fewer TLB misses, 8-12% faster fp32 decoding here), and never
fails where it cannot."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from edgespec.runtime import huge_pages

MB = 1 << 20


def anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory, as malloc maps it (Python's default is shared)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def anon_huge_bytes() -> int:
    """AnonHugePages of this process, from the kernel's own accounting."""
    rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
    return sum(int(line.split()[1]) * 1024 for line in rollup if line.startswith("AnonHuge"))


def collapses_here() -> bool:
    """Whether this system collapses a new region (only that one: this runs at collection)."""
    if huge_pages._libc_madvise() is None:
        return False
    before = huge_pages.regions()
    region = anonymous(16 * MB)
    try:
        region.write(b"x" * (16 * MB))
        return huge_pages.collapse(before) > 0
    finally:
        region.close()


needs_collapse = pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists() or not collapses_here(),
    reason="this system cannot collapse memory into huge pages (not Linux 6.1+, or THP never)",
)


@needs_collapse
def test_new_anonymous_memory_is_collapsed_and_older_memory_left_alone():
    older = anonymous(16 * MB)
    older.write(b"o" * (16 * MB))
    before = huge_pages.regions()
    new = anonymous(32 * MB)
    new.write(b"n" * (32 * MB))
    try:
        assert huge_pages.collapse(before) >= 16 * MB
        assert anon_huge_bytes() >= 16 * MB
        assert new[:1] == b"n" and new[-1:] == b"n" and older[:1] == b"o"  # same bytes
    finally:
        new.close()
        older.close()


@needs_collapse
def test_a_loaded_bundle_has_its_weights_in_huge_pages_unless_asked_not_to(tmp_path):
    import edgespec
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    dims = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=2)
    dims.update(num_attention_heads=8, max_position_embeddings=64)
    checkpoint = write_checkpoint(tmp_path / "c", "llama", **dims)
    export_bundle(checkpoint, tmp_path / "b")
    start = anon_huge_bytes()
    plain = edgespec.load(tmp_path / "b", huge_pages=False)
    assert anon_huge_bytes() - start < 8 * MB  # ~25 MB of weights, none collapsed
    start = anon_huge_bytes()
    model = edgespec.load(tmp_path / "b", huge_pages=True)
    assert anon_huge_bytes() - start >= 8 * MB
    ids = [5, 9, 13]
    assert (
        model.generate(ids, max_new_tokens=6).tokens == plain.generate(ids, max_new_tokens=6).tokens
    )


def test_collapse_is_harmless_where_the_system_cannot(monkeypatch):
    monkeypatch.setattr(huge_pages, "THP", Path("/nonexistent/enabled"))
    monkeypatch.setattr(huge_pages, "_madvise", None)
    assert huge_pages.collapse() == 0
