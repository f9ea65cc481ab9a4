"""The object an app holds: a loaded bundle that turns prompts into text.

`Model.load(bundle)` validates the manifest, opens the graph sessions it needs on the chosen
device and reads the tokenizer; `stream()` yields text pieces as tokens are produced and
`generate()` returns the whole result with its stats. Bad input is refused here, before any
work, with a `InputError` saying what to change. numpy + onnxruntime only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import BundleError, Manifest, load_manifest
from edgespec.devices import Profile, get_profile
from edgespec.runtime.calibrate import load_cost
from edgespec.runtime.chat import ChatOptions, ChatReply, ChatSession
from edgespec.runtime.coreml import open_coreml
from edgespec.runtime.decode import decode
from edgespec.runtime.drafters import (
    DraftModelDrafter,
    EarlyExitDrafter,
    LookupDrafter,
    NoDrafter,
)
from edgespec.runtime.graph import GraphSession, session_options
from edgespec.runtime.policies import (
    Acceptance,
    Auto,
    DraftLengthPolicy,
    DynamicExit,
    FixedLength,
    make_policy,
)
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.speculative import Drafter
from edgespec.runtime.static import StaticGraphSession
from edgespec.runtime.stats import GenerationStats, RoundStats
from edgespec.runtime.target import Target
from edgespec.runtime.tokenizer import Tokenizer

Prompt = str | Sequence[int] | np.ndarray


class InputError(ValueError):
    """A generation request cannot be served as given; the message says what to change."""


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


MODES = ("ar", "spec", "self-spec", "lookup", "split")


class Model:
    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        target: Target | None,
        tokenizer: Tokenizer,
        mode: str,
        drafter: Drafter,
        policy: DraftLengthPolicy,
        remote: Any = None,
    ) -> None:
        self.folder, self.manifest, self.target, self.tokenizer = (
            folder,
            manifest,
            target,
            tokenizer,
        )
        self.mode, self.drafter, self.policy = mode, drafter, policy
        self.remote = remote  # split mode: the server session (`edgespec.serve.client.Remote`)
        self._chat: ChatSession | None = None  # the conversation `chat()` continues

    @classmethod
    def load(
        cls,
        bundle: str | os.PathLike,
        *,
        mode: str = "ar",
        draft_policy: str | None = None,
        exit_layer: int | None = None,
        lookup: bool = False,
        device: str = "cpu",
        threads: int | None = None,
        verifier: str = "full",
        shared_threads: bool = True,
        server: str | None = None,
        drafter: str | None = None,
        token: str | None = None,
        energy_budget: float | None = None,
        timeout: float = 10.0,
        local_fallback: bool = True,
        static: bool = False,
        coreml: bool = False,
    ) -> Model:
        """Open a bundle for decoding.

        mode: "ar" | "spec" (the bundle's draft model) | "self-spec" (early exit at
        `exit_layer`, default the deepest exported; "dynamic-exit" policy picks per round) |
        "lookup" (prompt lookup). `lookup=True` adds prompt lookup in front of the spec or
        self-spec drafter. draft_policy: "fixed:N" | "confidence:T" | "acceptance" | "auto"
        | "dynamic-exit" (default "auto": speculates only while it is measured to win).
        verifier: "full" or "exit:K" (head@K then tail@K) for ar/spec/lookup.
        threads: intra-op threads (default one per core). shared_threads: run on
        onnxruntime's process-wide thread pool, sized by the first load (see
        `graph.session_options`; False gives each graph its own pool, which is slower for
        speculative modes but leaves the process free of a global pool).

        mode "split" (needs the [serve] extra): draft here with `drafter` ("draft" | "exit:K"
        | "lookup"), verify on `server` ("ws://HOST:PORT", bearer `token`); draft_policy
        defaults to channel-aware; `energy_budget` (J per token) goes to the policy;
        `timeout`: seconds to wait for one answer; `local_fallback`: continue on the
        bundle's own `full` graph when the server cannot be reached.

        static: run the bundle's fixed-shape graphs (exported with `--static`; standard ONNX
        ops, for NPUs that reject dynamic shapes) in every mode but split; prompt plus
        max_new_tokens must then fit their max context.
        coreml: run the bundle's Core ML packages (exported with `--coreml`) through
        coremltools — macOS 15+ only, written and tested off-device (runtime/coreml.py).
        """
        folder = Path(bundle)
        manifest = load_manifest(folder)
        if mode not in MODES:
            raise InputError(f"mode {mode!r} is not one of: {', '.join(MODES)}")
        if manifest.variant == "shared-backbone" and mode != "split":
            raise InputError(
                f"{folder} is a shared-backbone edge bundle: it holds a frozen draft "
                f"(head@{manifest.backbone_layers}) and no verifier, so it decodes only with "
                "mode='split' and a server running the target (--mode split --server URL)"
            )
        if (static or coreml) and mode == "split":
            raise InputError("split mode does not run static or Core ML graphs yet: drop them")
        if static and coreml:
            raise InputError("choose static=True (ONNX for NPUs) or coreml=True, not both")
        profile = get_profile(device)
        # NPU profiles reject dynamic shapes: they run the bundle's static graphs
        static = static or (profile.static_shapes and not coreml and mode != "split")
        open_graph = _graph_opener(
            folder, manifest, profile, threads, shared_threads, static, coreml
        )
        exits = manifest.exit_layers
        if mode == "split":
            from edgespec.serve.split import build_split

            if lookup or exit_layer is not None or verifier != "full":
                raise InputError("split mode: choose the drafter with drafter=draft|exit:K|lookup")
            remote, local, split_drafter, policy = build_split(
                manifest,
                open_graph,
                server,
                drafter,
                draft_policy,
                token,
                energy_budget,
                timeout,
                local_fallback,
                device_profile=profile.policy_profile(),
            )
            tokenizer = Tokenizer.from_dir(folder)
            return cls(folder, manifest, local, tokenizer, mode, split_drafter, policy, remote)
        if server or drafter or token or energy_budget is not None:
            raise InputError("server=/drafter=/token=/energy_budget= are options of mode='split'")
        if mode == "self-spec":
            if not exits:
                raise InputError(
                    "self-spec needs early-exit graphs: re-export with `--exit-layers K`"
                )
            k = exit_layer if exit_layer is not None else exits[-1]
            if k not in exits:
                raise InputError(f"exit layer {k} is not in this bundle (it has {exits})")
            verifier = f"exit:{k}"
        if verifier == "full":
            stages = [open_graph("full")]
        elif verifier.startswith("exit:") and verifier[5:].isdigit():
            stages = [open_graph(f"head@{verifier[5:]}"), open_graph(f"tail@{verifier[5:]}")]
        else:
            raise InputError(f"verifier {verifier!r} is not one of: full, exit:K")
        target = Target(stages)
        tokenizer = Tokenizer.from_dir(folder)
        if mode == "ar":
            if lookup or draft_policy:
                raise InputError("mode 'ar' drafts nothing: drop --lookup/--draft-policy")
            return cls(folder, manifest, target, tokenizer, "ar", NoDrafter(), FixedLength(0))
        drafter: Drafter = NoDrafter()
        if mode == "spec":
            drafter = DraftModelDrafter(Target([open_graph("draft")]))
        elif mode == "self-spec":
            heads = {k: open_graph(f"head@{k}") for k in exits}
            tails = {k: open_graph(f"tail@{k}") for k in exits}
            heads[k], tails[k] = stages
            drafter = EarlyExitDrafter(target, heads, tails, k)
        if mode == "lookup" or lookup:
            drafter = LookupDrafter(fallback=None if mode == "lookup" else drafter)
        try:
            policy = make_policy(draft_policy or "auto", exits)
        except ValueError as e:
            raise InputError(str(e)) from None
        if isinstance(policy, DynamicExit) and mode != "self-spec":
            raise InputError("the dynamic-exit policy chooses exit layers: use it with self-spec")
        if isinstance(policy, DynamicExit) and coreml:
            raise InputError(
                "dynamic-exit cannot run on Core ML packages: each head holds its layers' KV "
                "in its own state, so switching exits would read stale caches; use a fixed "
                "--exit-layer"
            )
        seed_from_calibration(
            policy, folder, device, threads, mode, k if mode == "self-spec" else 0
        )
        return cls(folder, manifest, target, tokenizer, mode, drafter, policy)

    # -- requests ---------------------------------------------------------------------------
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
    ) -> Iterator[Chunk]:
        """Yield text pieces as tokens are produced; the last chunk carries finish_reason."""
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        try:
            params = SamplingParams(temperature, top_p, top_k, seed)
        except ValueError as e:
            raise InputError(str(e)) from None
        ids = self.encode(prompt)
        fixed = self.target.fixed_capacity if self.target is not None else None
        if fixed is not None and len(ids) + max_new_tokens > fixed:
            raise InputError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) is "
                f"beyond the static graphs' max context of {fixed} positions: lower "
                f"max_new_tokens to {max(fixed - len(ids), 0)} or less, shorten the prompt, or "
                "re-export with a larger `--max-context`"
            )
        stop = frozenset() if ignore_eos else frozenset(self.manifest.eos_token_ids)
        detok = self.tokenizer.stream_decoder(skip_special_tokens=True)
        if self.remote is not None:
            from edgespec.serve.split import split_decode

            steps = split_decode(
                self.remote,
                self.target,
                self.drafter,
                self.policy,
                ids,
                params,
                max_new_tokens,
                stop,
                self.manifest.target.max_position_embeddings,
            )
        else:
            assert self.target is not None
            steps = decode(
                self.target, self.drafter, self.policy, ids, params, max_new_tokens, stop
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
    def chat_session(self, system: str | None = None) -> ChatSession:
        """A conversation with caches of its own: each turn prefills only what is new (see
        `edgespec.runtime.chat`). Needs a bundle with a chat template."""
        return ChatSession(self, system)

    def chat(self, messages: Sequence[dict[str, Any]], **options: Any) -> ChatReply:
        """Reply to a conversation (a list of {"role", "content"} messages) with the bundle's
        chat template; consecutive calls keep the shared prefix in the cache. `options` are
        `ChatOptions` fields (max_new_tokens, temperature, stop, tools, flags, ...)."""
        if self._chat is None:
            self._chat = ChatSession(self)
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


def chat_options(**options: Any) -> ChatOptions:
    """ChatOptions from keyword arguments, refusing unknown names with the known ones."""
    try:
        return ChatOptions(**options)
    except TypeError:
        known = ", ".join(ChatOptions.__dataclass_fields__)
        unknown = ", ".join(sorted(set(options) - set(ChatOptions.__dataclass_fields__)))
        raise InputError(f"unknown chat option(s) {unknown}; the options are: {known}") from None


def seed_from_calibration(
    policy: DraftLengthPolicy, folder: Path, device: str, threads: int | None, mode: str, exit: int
) -> None:
    """Start adaptive policies from this device's measured round costs, when calibrated."""
    if isinstance(policy, DynamicExit):
        for k in policy.exits:
            cost = load_cost(folder, device, threads, f"self-spec@{k}")
            if cost is not None:
                policy.costs[k] = cost
    elif isinstance(policy, Auto | Acceptance):
        cost = load_cost(folder, device, threads, f"self-spec@{exit}" if exit else mode)
        if cost is not None:
            policy.cost = cost


def _graph_opener(
    folder: Path,
    manifest: Manifest,
    profile: Profile,
    threads: int | None,
    shared_threads: bool,
    static: bool = False,
    coreml: bool = False,
):
    """role -> GraphSession (or StaticGraphSession, CoreMLSession), same device and threads."""
    if coreml:
        variants = manifest.coreml
        if variants is None:
            raise BundleError(
                f"bundle {folder} has no Core ML packages; re-export it with "
                "`edgespec export MODEL --out FOLDER --coreml` (needs the [coreml] extra)"
            )

        def open_package(role: str) -> GraphSession:
            package = variants.package(role)
            session = open_coreml(folder, package, manifest.model_info(package), variants)  # type: ignore[arg-type]
            return session  # type: ignore[return-value]  # same call interface

        return open_package
    if static and manifest.static is None:
        raise BundleError(
            f"bundle {folder} has no static graphs; re-export it with "
            "`edgespec export MODEL --out FOLDER --static --max-context 512 --verify-width 8`"
        )
    providers = profile.session_providers()
    options = session_options(threads, shared_threads)
    profile.apply_session_options(options)
    kv_dtype = np.dtype(np.float16 if manifest.dtype == "fp16" else np.float32)

    def open_graph(role: str) -> GraphSession:
        if static:
            variants = manifest.static
            assert variants is not None
            graphs = variants.graphs_for(role)
            return StaticGraphSession(  # type: ignore[return-value]  # same call interface
                folder,
                graphs,
                manifest.model_info(next(iter(graphs.values()))),
                providers,
                options,
                kv_dtype,
                variants.max_context,
            )
        graph = manifest.graph(role)
        return GraphSession(folder, graph, manifest.model_info(graph), providers, options, kv_dtype)

    return open_graph


__all__ = [
    "BundleError",
    "ChatOptions",
    "ChatReply",
    "ChatSession",
    "Chunk",
    "Generation",
    "InputError",
    "Model",
]
