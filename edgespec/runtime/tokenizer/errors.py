"""The tokenizer's one error: a file missing, corrupt or unsupported, or an id out of range."""

from __future__ import annotations

from typing import Any

from edgespec.errors import EdgespecError


class TokenizerError(EdgespecError, ValueError):
    """A tokenizer file is missing, corrupt or unsupported, or an id is out of range."""


def _unsupported(what: str, cfg: dict[str, Any], supported: str) -> TokenizerError:
    return TokenizerError(f"unsupported {what} type {cfg.get('type')!r}; supported: {supported}")
