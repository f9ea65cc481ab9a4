"""Backbone fingerprints: may a frozen edge draft run against this cloud target?

A bundle exported by this edgespec records in its manifest `backbone`:

    {"tokenizer": sha256 of the vocabulary,
     "base":      sha256 of the embedding table, learned positions / rotary tables and the
                  attention shape (what every layer's input depends on),
     "layers":    [sha256 of layer i's weights, for every layer]}

The fingerprint at depth k hashes "base" and layers 0..k-1. A shared-backbone edge bundle
(a frozen draft made of the target's lower k layers) and a cloud target are compatible
when the tokenizer hashes are equal and the depth-k fingerprints are equal: the target may
have been retrained above layer k (its upper layers, final norm, an untied LM head) and the
edge bundle keeps working without a download. (Losslessness never depends on this: the
server verifies every token. Compatibility protects the draft's quality and the token ids.)

The edge says which backbone it was cut from in the START message's fingerprint field, as
`backbone:K:TOKENIZER_HEX:LOWER_HEX` (`hello`); the server answers a mismatch with a reason
naming what differs (`check_hello`). Standard library only: the runtime and server use it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from edgespec.errors import EdgespecError

HELLO_PREFIX = "backbone:"


class BackboneMismatch(EdgespecError, ValueError):
    """The edge bundle and the target do not share a backbone; the message says what differs."""


def depth_fingerprint(backbone: dict[str, Any], k: int) -> str:
    """sha256 hex of the embeddings and layers 0..k-1 (the shared lower backbone)."""
    layers = backbone["layers"]
    if not 0 < k <= len(layers):
        raise BackboneMismatch(
            f"the target has {len(layers)} layers, so it has no backbone of depth {k}"
        )
    h = hashlib.sha256(backbone["base"].encode())
    for digest in layers[:k]:
        h.update(digest.encode())
    return h.hexdigest()


def hello(manifest: Any) -> str:
    """What a shared-backbone edge bundle sends at connect time."""
    k = manifest.backbone_layers
    bb = manifest.backbone
    return f"{HELLO_PREFIX}{k}:{bb['tokenizer']}:{depth_fingerprint(bb, k)}"


def parse_hello(text: str) -> tuple[int, str, str] | None:
    """(k, tokenizer hex, lower hex) from a `hello`, or None for a plain fingerprint."""
    if not text.startswith(HELLO_PREFIX):
        return None
    parts = text[len(HELLO_PREFIX) :].split(":")
    # ASCII digits only: str.isdigit() is true for "³", which int() refuses; a depth is a
    # layer count, and int() refuses more than 4,300 digits
    depth = parts[0] if parts else ""
    if len(parts) != 3 or not (depth.isascii() and depth.isdigit() and len(depth) <= 9):
        raise BackboneMismatch(f"malformed backbone fingerprint {text[:40]!r}")
    return int(parts[0]), parts[1], parts[2]


def check(
    backbone: dict[str, Any] | None, k: int, tokenizer: str, lower: str, what: str = "this server"
) -> None:
    """Raise BackboneMismatch naming what differs, if an edge cut at depth k with these
    hashes cannot draft for the target whose manifest records `backbone`."""
    if backbone is None:
        raise BackboneMismatch(
            f"{what}'s bundle records no backbone hashes (exported by an older edgespec): "
            "re-export the cloud bundle with this edgespec"
        )
    if backbone["tokenizer"] != tokenizer:
        raise BackboneMismatch(
            f"the tokenizer differs between the edge bundle and {what}'s target "
            f"(edge {tokenizer[:12]}..., target {backbone['tokenizer'][:12]}...): token ids "
            "would not mean the same thing; export a new edge bundle from this target"
        )
    n = len(backbone["layers"])
    if k >= n:
        raise BackboneMismatch(
            f"the edge bundle shares {k} layers but {what}'s target has only {n}: "
            "export a new edge bundle from this target"
        )
    if depth_fingerprint(backbone, k) != lower:
        raise BackboneMismatch(
            f"the lower {k} layers or the embeddings of {what}'s target differ from the ones "
            f"the edge bundle was cut from (backbone@{k} edge {lower[:12]}..., target "
            f"{depth_fingerprint(backbone, k)[:12]}...): the target was retrained below layer "
            f"{k}; export a new edge bundle with `edgespec export TARGET --variant "
            f"shared-backbone --backbone-layers {k}`"
        )


def check_hello(backbone: dict[str, Any] | None, text: str) -> None:
    parsed = parse_hello(text)
    if parsed is not None:
        check(backbone, *parsed)


def compatibility(edge: Any, cloud: Any) -> tuple[bool, str]:
    """(compatible, reason) for an edge bundle's manifest against a cloud bundle's."""
    if edge.variant != "shared-backbone":
        return False, (
            "the edge bundle is not a shared-backbone bundle (export it with "
            "`--variant shared-backbone --backbone-layers K`)"
        )
    if cloud.variant == "shared-backbone":
        return False, "the cloud bundle is itself an edge bundle: give the target's bundle"
    k, bb = edge.backbone_layers, edge.backbone
    try:
        check(cloud.backbone, k, bb["tokenizer"], depth_fingerprint(bb, k), "the cloud bundle")
    except BackboneMismatch as e:
        return False, str(e)
    if len(bb["layers"]) != len(cloud.backbone["layers"]):
        changed = "a different number of upper layers"
    elif upper := sum(a != b for a, b in zip(bb["layers"], cloud.backbone["layers"], strict=True)):
        changed = f"{upper} of its upper layers retrained"
    else:
        changed = "the same layers"
    return True, f"shares the tokenizer and backbone@{k} (the cloud target has {changed})"
