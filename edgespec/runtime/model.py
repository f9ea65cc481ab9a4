"""The object an app holds: a loaded bundle that turns prompts into text.

`Model.load(bundle)` validates the manifest, opens the graph sessions it needs on the chosen
device and reads the tokenizer; `stream()` yields text pieces as tokens are produced and
`generate()` returns the whole result with its stats. Bad input is refused here, before any
work, with a `InputError` saying what to change. numpy + onnxruntime only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edgespec.bundle import BundleError, Manifest
from edgespec.devices import get_profile
from edgespec.runtime.chat.session import ChatOptions, ChatReply, ChatSession
from edgespec.runtime.config import LoadConfig
from edgespec.runtime.decode import decode
from edgespec.runtime.errors import InputError
from edgespec.runtime.grammar.engine import (
    Grammar,
    Vocabulary,
    bundle_vocabulary,
    from_response_format,
)
from edgespec.runtime.graphs.opener import BundleGraphs, GraphOptions, open_bundle
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.modes import DEFAULT_EAGLE_DRAFTER, DEFAULT_SPEC_DRAFTER
from edgespec.runtime.policies.costs import best_local, calibration_entry
from edgespec.runtime.registry import MODES, Decoder, build
from edgespec.runtime.round import Verifier
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.split.session import Remote
from edgespec.runtime.stats import GenerationStats, RoundStats

Prompt = str | Sequence[int] | np.ndarray


@dataclass
class Chunk:
    """A streamed piece: the text that became final and the token ids behind it."""

    text: str
    tokens: list[int]
    stats: RoundStats
    finish_reason: str | None = None


@dataclass
class Generation:
    text: str
    tokens: list[int]
    prompt_tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)


class Model:
    def __init__(self, graphs: BundleGraphs, config: LoadConfig, decoder: Decoder) -> None:
        self.graphs, self.config = graphs, config
        self.folder, self.manifest = graphs.folder, graphs.manifest
        self.tokenizer = graphs.tokenizer()
        self.mode = config.mode
        self.verifier, self.drafter, self.policy = decoder.verifier, decoder.drafter, decoder.policy
        # the local target graphs (None: a split bundle that verifies only on the server)
        self.target: Stack | None = decoder.target
        # split mode: the server session (its timeouts and retries may be tuned)
        self.remote: Remote | None = decoder.remote
        self._chat: ChatSession | None = None  # the conversation `chat()` continues

    @classmethod
    def load(
        cls, bundle: str | os.PathLike, config: LoadConfig | None = None, **options: Any
    ) -> Model:
        """Open a bundle for decoding, as `config` says (or flat keywords naming its fields:
        `Model.load(b, mode="spec", draft_policy="fixed:4")`; see `runtime.config`).

        mode: "ar" | "spec" (the bundle's draft model) | "eagle" (its feature head, made by
        `edgespec distill`) | "self-spec" (early exit at
        `exit_layer`, default the deepest exported; "dynamic-exit" policy picks per round) |
        "lookup" (prompt lookup) | "suffix" (SuffixDecoding) | "recycle" (Token Recycling) |
        "split" (verify on `server`). drafter: any mode's drafter
        by name, chains such as "lookup+draft" included (`runtime.registry`). draft_policy
        default: "auto" (speculates only while it is measured to win; split: channel-aware).
        static / coreml: run the bundle's fixed-shape (NPU) graphs or Core ML packages; a
        device profile that needs static shapes picks the static graphs.
        """
        if config is None:
            config = LoadConfig.from_options(**options)
        elif options:
            raise InputError("pass a LoadConfig or keyword options, not both")
        c = config
        if c.mode is not None and c.mode not in MODES:
            raise InputError(f"mode {c.mode!r} is not one of: {', '.join(MODES)}")
        if (c.static or c.coreml) and c.mode == "split":
            raise InputError("split mode does not run static or Core ML graphs yet: drop them")
        if c.static and c.coreml:
            raise InputError("choose static=True (ONNX for NPUs) or coreml=True, not both")
        # NPU profiles reject dynamic shapes: they run the bundle's static graphs
        static = c.static or (
            get_profile(c.device).static_shapes and not c.coreml and c.mode != "split"
        )
        options = GraphOptions(
            c.device, c.threads, c.shared_threads, static, c.coreml, c.huge_pages
        )
        return cls.from_graphs(open_bundle(bundle, options), c)

    @classmethod
    def from_graphs(cls, graphs: BundleGraphs, config: LoadConfig) -> Model:
        """A model over a bundle already opened: the graphs it needs come from `graphs`, so
        those someone opened there before (the server's target) are shared, not loaded again."""
        config = resolve_mode(graphs, config)
        return cls(graphs, config, build(graphs, config))

    # -- requests ---------------------------------------------------------------------------
    def vocabulary(self) -> Vocabulary:
        """The tokenizer as the grammar engine sees it (built on first use, then kept)."""
        return bundle_vocabulary(self.folder, self.manifest)

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(i) for i in np.asarray(prompt).reshape(-1)]
        if not ids:
            raise InputError("the prompt is empty: give some text or at least one token id")
        vocab = self.manifest.target.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        context = self.manifest.target.max_position_embeddings
        if len(ids) >= context:
            raise InputError(
                f"the prompt is {len(ids)} tokens but the model's context is {context}: "
                f"shorten it to at most {context - 1} tokens"
            )
        return ids

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        ignore_eos: bool = False,
        response_format: dict | Grammar | None = None,
    ) -> Iterator[Chunk]:
        """Yield text pieces as tokens are produced; the last chunk carries finish_reason.
        response_format: an OpenAI-style {"type": "json_object"} or {"type": "json_schema",
        "json_schema": {"name", "schema"}} (or a `runtime.grammar.engine.Grammar`): every token
        follows it, in every mode (needs the [grammar] extra)."""
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        try:
            params = SamplingParams(temperature, top_p, top_k, seed)
        except ValueError as e:
            raise InputError(str(e)) from None
        ids = self.encode(prompt)
        fixed = self.target.fixed_capacity if self.target is not None else None
        # split: the local graphs are the fallback; the server's context is its own
        if fixed is not None and len(ids) + max_new_tokens > fixed:
            raise InputError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) is "
                f"beyond the static graphs' max context of {fixed} positions: lower "
                f"max_new_tokens to {max(fixed - len(ids), 0)} or less, shorten the prompt, or "
                "re-export with a larger `--max-context`"
            )
        grammar = from_response_format(response_format)
        if grammar is not None and ignore_eos:
            raise InputError("ignore_eos: a response_format ends where its grammar ends")
        constraint = grammar.start(self.vocabulary(), len(ids)) if grammar else None
        stop = frozenset() if ignore_eos else frozenset(self.manifest.eos_token_ids)
        detok = self.tokenizer.stream_decoder(skip_special_tokens=True)
        steps = decode(
            self.verifier,
            self.drafter,
            self.policy,
            ids,
            params,
            max_new_tokens,
            stop,
            constraint=constraint,
        )
        for step in steps:
            # ids past the tokenizer's vocab (padded embedding rows) have no text, as in
            # transformers: they stay in .tokens but are not decoded
            text = "".join(
                detok.push(t) for t in step.tokens if self.tokenizer.id_to_token(t) is not None
            )
            if step.finish_reason:
                text += detok.flush()
            yield Chunk(text, step.tokens, step.stats, step.finish_reason)

    # -- conversations ----------------------------------------------------------------------
    def chat_session(
        self,
        system: str | None = None,
        max_context: int | None = None,
        verifier: Verifier | None = None,
    ) -> ChatSession:
        """A conversation with caches of its own: each turn prefills only what is new (see
        `edgespec.runtime.chat.session`). Needs a bundle with a chat template. `max_context`: a cap
        below the model's; `verifier`: one that holds the conversation's target cache
        elsewhere (the server's KV pool)."""
        return ChatSession(
            self.graphs, self.config, self.tokenizer, system, max_context, verifier, self.remote
        )

    def chat(self, messages: Sequence[dict[str, Any]], **options: Any) -> ChatReply:
        """Reply to a conversation (a list of {"role", "content"} messages) with the bundle's
        chat template; consecutive calls keep the shared prefix in the cache. `options` are
        `ChatOptions` fields (max_new_tokens, temperature, stop, tools, flags, ...)."""
        if self._chat is None:
            self._chat = self.chat_session()
        return self._chat.reply(messages, chat_options(**options))

    def generate(self, prompt: Prompt, **options) -> Generation:
        """Run `stream()` to the end; return the text, tokens and stats."""
        prompt_ids = self.encode(prompt)
        stats = GenerationStats()
        tokens: list[int] = []
        finish = "length"
        for chunk in self.stream(prompt_ids, **options):
            tokens += chunk.tokens
            stats.add(chunk.stats)
            finish = chunk.finish_reason or finish
        known = [t for t in tokens if self.tokenizer.id_to_token(t) is not None]
        text = self.tokenizer.decode(known, skip_special_tokens=True)
        return Generation(text, tokens, prompt_ids, finish, stats)


def resolve_mode(graphs: BundleGraphs, config: LoadConfig) -> LoadConfig:
    """`config` with its mode chosen when none was given: self-spec if an exit layer was,
    spec (verified by the full model) if a drafter was, plain decoding if a verifier was or
    the graphs are fixed-shape ones (NPUs, Core ML), else the mode this bundle's calibration
    on this device favours (`costs.best_local`; its `spec` drafts with prompt lookup, then the
    draft model: `modes.DEFAULT_SPEC_DRAFTER`)."""
    c = config
    if c.mode is not None:
        return c
    if c.exit_layer is not None:
        return replace(c, mode="self-spec")
    if c.drafter is not None:
        return replace(c, mode="spec")
    if c.verifier is not None or graphs.options.static or graphs.options.coreml:
        return replace(c, mode="ar")  # a chosen verifier, or fixed-shape graphs: uncalibrated
    calibration = calibration_entry(graphs.folder, c.device, c.threads)
    mode, exit_layer = best_local(graphs.manifest, calibration)
    drafter = {"spec": DEFAULT_SPEC_DRAFTER, "eagle": DEFAULT_EAGLE_DRAFTER}.get(mode)
    return replace(
        c, mode=mode, exit_layer=exit_layer if mode == "self-spec" else None, drafter=drafter
    )


def chat_options(**options: Any) -> ChatOptions:
    """ChatOptions from keyword arguments, refusing unknown names with the known ones."""
    try:
        return ChatOptions(**options)
    except TypeError:
        known = ", ".join(ChatOptions.__dataclass_fields__)
        unknown = ", ".join(sorted(set(options) - set(ChatOptions.__dataclass_fields__)))
        raise InputError(f"unknown chat option(s) {unknown}; the options are: {known}") from None


__all__ = [
    "BundleError",
    "ChatOptions",
    "ChatReply",
    "ChatSession",
    "Chunk",
    "Generation",
    "InputError",
    "LoadConfig",
    "Model",
    "Manifest",
]
