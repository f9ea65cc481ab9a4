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

import numpy as np

from edgespec.bundle import BundleError, Manifest, load_manifest
from edgespec.devices import providers_for
from edgespec.runtime.generate import GenerationStats, RoundStats, decode_ar
from edgespec.runtime.graph import GraphSession, session_options
from edgespec.runtime.sampling import SamplingParams
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


class Model:
    def __init__(self, folder: Path, manifest: Manifest, target: Target, tokenizer: Tokenizer):
        self.folder, self.manifest, self.target, self.tokenizer = (
            folder,
            manifest,
            target,
            tokenizer,
        )

    @classmethod
    def load(
        cls,
        bundle: str | os.PathLike,
        *,
        device: str = "cpu",
        threads: int | None = None,
        verifier: str = "full",
    ) -> Model:
        """Open a bundle. `verifier` is "full" or "exit:K" (head@K + tail@K back to back)."""
        folder = Path(bundle)
        manifest = load_manifest(folder)
        providers = providers_for(device)
        options = session_options(threads)
        kv_dtype = np.dtype(np.float16 if manifest.dtype == "fp16" else np.float32)
        if verifier == "full":
            roles = ["full"]
        elif verifier.startswith("exit:") and verifier[5:].isdigit():
            k = verifier[5:]
            roles = [f"head@{k}", f"tail@{k}"]
        else:
            raise InputError(f"verifier {verifier!r} is not one of: full, exit:K")
        stages = []
        for role in roles:
            graph = manifest.graph(role)
            stages.append(
                GraphSession(
                    folder, graph, manifest.model_info(graph), providers, options, kv_dtype
                )
            )
        tokenizer = Tokenizer.from_dir(folder)
        return cls(folder, manifest, Target(stages), tokenizer)

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
        context = self.target.max_positions
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
        stop = frozenset() if ignore_eos else frozenset(self.manifest.eos_token_ids)
        detok = self.tokenizer.stream_decoder(skip_special_tokens=True)
        for step in decode_ar(self.target, ids, params, max_new_tokens, stop):
            text = "".join(detok.push(t) for t in step.tokens)
            if step.finish_reason:
                text += detok.flush()
            yield Chunk(text, step.tokens, step.stats, step.finish_reason)

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
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Generation(text, tokens, prompt_ids, finish, stats)


__all__ = ["BundleError", "Chunk", "Generation", "InputError", "Model"]
