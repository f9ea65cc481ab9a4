"""Conversations that keep their KV cache: `ChatSession` renders, prefills only what is new,
decodes with the model's mode and stops on stop ids or stop strings.

Takes a bundle's opened graphs, the `LoadConfig` its `Model` was loaded with and its tokenizer
(`Model.chat_session`), for a bundle that carries a chat template. Each turn the session renders the
whole conversation with the template (as transformers' `apply_chat_template` would), encodes
it, and compares it with the token sequence its caches hold from the last turn: the longest
common prefix stays in the target's KV cache, the draft model's cache and the prompt-lookup
index (the early-exit head shares the target's cache), and only the rest is prefilled. What is
kept is exact by construction — a token prefix, never text — so greedy replies equal
transformers' `apply_chat_template` + `generate` token for token, turn after turn.

Each session is a build of its own through the registry (`registry.build`): fresh caches and
estimates over the same opened graph sessions, and in split mode a server connection of its
own. Several conversations (the OpenAI server's) never share or clobber each other's state,
and plain `Model.generate` never touches them; a
session may be given a `verifier` of its own instead of a local target cache (the server's:
a row of its KV pool, verified in batches with other sessions' rounds). A
conversation that outgrows the context is refused with a `ChatError` naming the turn, unless
`truncation="drop-oldest"` was asked for. In split mode the session owns a server connection
whose server session is paused after each turn and resumed by the next: the server keeps the
longest prefix its cache shares with the new prompt and prefills only the rest (a session it
no longer holds is rebuilt from the whole prompt). `close()` — or `reset()`, or the session
being garbage collected — ENDs it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgespec.runtime.chat import store as chat_store
from edgespec.runtime.chat.template import RENDER_ARGUMENTS, ChatTemplate, ChatTemplateError
from edgespec.runtime.chat.tool_calls import ToolCall, parse, reply_format
from edgespec.runtime.config import LoadConfig
from edgespec.runtime.decode import decode
from edgespec.runtime.grammar.engine import Grammar, bundle_vocabulary
from edgespec.runtime.graphs.opener import BundleGraphs
from edgespec.runtime.registry import build
from edgespec.runtime.round import Verifier
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.split.session import Remote
from edgespec.runtime.stats import GenerationStats, RoundStats
from edgespec.runtime.tokenizer import Tokenizer

TRUNCATION = ("error", "drop-oldest")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


class ChatError(ChatTemplateError):
    """A chat request cannot be served as given (bad options, over the context, no template)."""


@dataclass
class ChatOptions:
    """One reply's settings. None for temperature/top_p/top_k: the bundle's generation
    defaults (its generation_config), else greedy."""

    max_new_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Sequence[str] = ()  # stop strings: the reply ends before the first one
    stop_ids: Sequence[int] = ()  # stop token ids, besides the bundle's eos ids
    ignore_eos: bool = False
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    template: str | None = None  # a named template of the bundle
    flags: dict[str, Any] = field(default_factory=dict)  # template variables: enable_thinking
    truncation: str = "error"  # or "drop-oldest": drop the oldest turns to fit the context
    tool_choice: Any = "auto"  # "none", "required", {"type": "function", "function": {"name"}}
    response_format: Any = None  # {"type": "json_object" | "json_schema", ..}, or a Grammar


@dataclass
class Prompt:
    """A checked, encoded request, ready for any session to decode."""

    ids: list[int]
    options: ChatOptions
    params: SamplingParams
    dropped: int = 0  # truncation="drop-oldest": messages left out
    grammar: Grammar | None = None  # from options.response_format or a forcing tool_choice
    tool_style: str | None = None  # the template's tool-call format, when calls are read


@dataclass
class ChatChunk:
    text: str
    tokens: list[int]
    stats: RoundStats
    finish_reason: str | None = None  # "stop" | "length" on the last chunk


@dataclass
class ChatReply:
    text: str
    tokens: list[int]
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens: kept in the KV cache, not prefilled
    finish_reason: str
    stats: GenerationStats
    dropped_messages: int = 0  # truncation="drop-oldest": how many were left out
    tool_calls: list[ToolCall] = field(default_factory=list)  # read from text (tools given)
    content: str | None = None  # with tools: the text less its calls (None: only calls)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatSession:
    """One conversation over its own caches. `stream(messages)` / `reply(messages)` take the
    whole conversation each turn (OpenAI style); `say(text)` keeps the messages here."""

    def __init__(
        self,
        graphs: BundleGraphs,
        config: LoadConfig,
        tokenizer: Tokenizer,
        system: str | None = None,
        max_context: int | None = None,
        verifier: Verifier | None = None,
        link_like: Remote | None = None,
    ) -> None:
        self.folder, self.manifest, self.tokenizer = graphs.folder, graphs.manifest, tokenizer
        self.max_context = max_context  # a server's cap on prompt + reply, below the model's
        # a bundle without a template still serves plain completions (`prepare_ids`)
        self.template = (
            ChatTemplate.from_bundle(self.folder, self.manifest) if self.manifest.chat else None
        )
        # caches of its own; in split mode also a server connection (and session) of its own
        own = build(graphs, config)
        self.drafter, self.policy, self.remote = own.drafter, own.policy, own.remote
        self.local = own.split is None
        if own.split is None:
            assert own.target is not None
            self.target = own.target
            # `verifier`: the conversation's cache is elsewhere (its drafter's stays here)
            self.verifier: Verifier = verifier or own.verifier
        else:
            assert own.remote is not None
            if link_like is not None:  # the model's link settings (timeouts, retries)
                own.remote.tune_like(link_like)
            own.split.hold = True  # the server session is kept between turns
            self.verifier = own.verifier
            # on garbage collection too: a server must not hold a forgotten conversation
            self._hang_up = weakref.finalize(self, hang_up, own.remote)
        self.system = system
        self.messages: list[dict[str, Any]] = []
        self.seq: list[int] = []  # the tokens whose positions the caches hold (a prefix of)
        self.last: ChatReply | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the caches are overwritten by the next turn; a server
        session is ENDed, the connection kept)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.seq = []
        self.last = None
        if self.remote is not None:
            self.remote.end()

    def close(self) -> None:
        """Split mode: END the server session and close the connection (local: nothing)."""
        if self.remote is not None:
            self._hang_up()

    # -- turns ------------------------------------------------------------------------------
    def say(self, text: str, options: ChatOptions | None = None) -> Iterator[ChatChunk]:
        """Add a user message, stream the reply, keep both in `messages`."""
        messages = [*self.messages, {"role": "user", "content": text}]
        pieces: list[str] = []
        for chunk in self.stream(messages, options):
            pieces.append(chunk.text)
            yield chunk
        self.messages = [*messages, {"role": "assistant", "content": "".join(pieces)}]

    def reply(
        self, messages: Sequence[dict[str, Any]], options: ChatOptions | None = None
    ) -> ChatReply:
        """Run `stream()` to the end; the whole reply with its stats."""
        for _ in self.stream(messages, options):
            pass
        assert self.last is not None
        return self.last

    def stream(
        self, messages: Sequence[dict[str, Any]], options: ChatOptions | None = None
    ) -> Iterator[ChatChunk]:
        """Yield the reply's text as it is decoded; the last chunk has finish_reason."""
        return self.stream_prompt(self.prepare(messages, options))

    def prepare(
        self, messages: Sequence[dict[str, Any]], options: ChatOptions | None = None
    ) -> Prompt:
        """Check the options, render and encode the conversation (touches no cache)."""
        o = options or ChatOptions()
        params = self._params(o)
        ids, dropped = self._prompt(list(messages), o)
        style, grammar = self._format(o)
        return Prompt(ids, o, params, dropped, grammar, style)

    def prepare_ids(self, ids: list[int], options: ChatOptions | None = None) -> Prompt:
        """A prompt that is already token ids (a plain completion: no template)."""
        o = options or ChatOptions()
        params = self._params(o)
        vocab = self.manifest.target.vocab_size
        if not ids:
            raise ChatError("the prompt is empty: give some text or at least one token id")
        if any(not 0 <= i < vocab for i in ids):
            raise ChatError(f"prompt token ids must be in 0..{vocab - 1}")
        if len(ids) >= self.context():
            raise ChatError(
                f"the prompt is {len(ids)} tokens but the model's context is {self.context()} "
                "positions: shorten it"
            )
        return Prompt(list(ids), o, params, 0, self._format(o, chat=False)[1])

    def shared_prefix(self, ids: Sequence[int]) -> int:
        """How many leading prompt tokens this session's caches may already hold."""
        return common_prefix(self.seq, ids)

    def stream_prompt(self, prompt: Prompt) -> Iterator[ChatChunk]:
        """Decode a prepared prompt, keeping the cached prefix; see `stream`."""
        ids, o, params = prompt.ids, prompt.options, prompt.params
        stop_ids = frozenset(o.stop_ids) | (
            frozenset() if o.ignore_eos else frozenset(self.manifest.eos_token_ids)
        )
        cached = self.shared_prefix(ids)
        self.seq = []  # until this turn ends cleanly, trust nothing in the caches
        max_new = min(o.max_new_tokens, self.context() - len(ids))  # stop at the context
        g = prompt.grammar  # the reply's grammar, from the prompt's end
        constraint = g.start(bundle_vocabulary(self.folder, self.manifest), len(ids)) if g else None
        parts = (self.verifier, self.drafter, self.policy)
        steps = decode(*parts, ids, params, max_new, stop_ids, cached, constraint)
        stats, tokens = GenerationStats(), []
        detok = self.tokenizer.stream_decoder(skip_special_tokens=True)
        stopper = StopStrings(o.stop)
        finish, kept, started = "length", 0, False
        try:
            for step in steps:
                stats.add(step.stats)
                if step.stats.phase == "prefill":
                    kept, started = step.stats.cached_tokens, True
                tokens += step.tokens
                text = "".join(detok.push(t) for t in step.tokens if self.tokenizer.id_to_token(t))
                if step.finish_reason:
                    text += detok.flush()
                text, hit = stopper.push(text, final=bool(step.finish_reason))
                if hit or step.finish_reason:
                    finish = "stop" if hit else FINISH[step.finish_reason or "length"]
                    r = self.last = ChatReply(
                        stopper.text, list(tokens), len(ids), kept, finish, stats, prompt.dropped
                    )
                    if prompt.tool_style:  # the model's calls, read in its template's format
                        r.content, r.tool_calls = parse(r.text, prompt.tool_style)
                        finish = r.finish_reason = "tool_calls" if r.tool_calls else finish
                    yield ChatChunk(text, step.tokens, step.stats, finish)
                    return
                yield ChatChunk(text, step.tokens, step.stats)
        finally:
            steps.close()  # a stop string or a closed stream ends the decode loop cleanly
            # once prefilled, every cache holds a prefix of prompt + reply (rounds truncate on
            # rejection, in a finally); a failed prefill leaves them unknown: trust nothing
            self.seq = [*ids, *tokens] if started else []

    # -- helpers ----------------------------------------------------------------------------
    def _format(self, o: ChatOptions, chat: bool = True) -> tuple[str | None, Grammar | None]:
        tools = o.tools if chat else None  # (the format calls are read in, the grammar)
        template = self.template.pick(o.template, tools) if tools and self.template else ""
        try:
            return reply_format(o, tools, template, self.tokenizer.token_to_id)
        except ValueError as e:
            raise ChatError(str(e)) from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the conversation and its caches to `path`, atomically; `load` resumes it."""
        chat_store.save(self, path)

    def load(self, path: str | os.PathLike) -> None:  # with the bundle and mode it was saved
        chat_store.load(self, path)

    def _params(self, o: ChatOptions) -> SamplingParams:
        if o.max_new_tokens < 1:
            raise ChatError(f"max_new_tokens must be at least 1, got {o.max_new_tokens}")
        if o.truncation not in TRUNCATION:
            raise ChatError(f"truncation {o.truncation!r} is not one of: {', '.join(TRUNCATION)}")
        if any(not isinstance(s, str) or not s for s in o.stop):
            raise ChatError("stop strings must be non-empty strings")
        taken = sorted(set(o.flags) & set(RENDER_ARGUMENTS))
        if taken:
            raise ChatError(
                f"flags: {', '.join(taken)} is set by the session itself, not a template flag: "
                "pass messages, tools, documents and template as their own arguments"
            )
        gen = self.manifest.chat.generation if self.manifest.chat else {}
        sampled = bool(gen.get("do_sample"))
        temperature = o.temperature
        if temperature is None:
            temperature = float(gen.get("temperature", 1.0)) if sampled else 0.0
        top_p = o.top_p if o.top_p is not None else float(gen.get("top_p", 1.0) if sampled else 1)
        top_k = o.top_k if o.top_k is not None else int(gen.get("top_k", 0) if sampled else 0)
        try:
            return SamplingParams(temperature, top_p, top_k, o.seed)
        except ValueError as e:
            raise ChatError(str(e)) from None

    def context(self) -> int:
        """Positions a prompt and its reply may fill together."""
        if self.local:
            limit = self.verifier.max_positions
        else:
            limit = self.manifest.target.max_position_embeddings
        return min(limit, self.max_context or limit)

    def _encode(self, messages: list[dict[str, Any]], o: ChatOptions) -> list[int]:
        if self.template is None:  # raises the error that says what is missing
            ChatTemplate.from_bundle(self.folder, self.manifest)
        assert self.template is not None
        text = self.template.render(
            messages,
            add_generation_prompt=True,
            tools=o.tools,
            documents=o.documents,
            template=o.template,
            **o.flags,
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ChatError("the conversation renders to no tokens: add a message with text")
        return ids

    def _prompt(self, messages: list[dict[str, Any]], o: ChatOptions) -> tuple[list[int], int]:
        """The prompt ids; with drop-oldest, the oldest non-system messages are dropped until
        the prompt and max_new_tokens fit (or one message is left). (ids, dropped count)."""
        context = self.context()
        ids = self._encode(messages, o)
        dropped = 0
        if o.truncation == "drop-oldest":
            first = 1 if messages and messages[0].get("role") == "system" else 0
            while len(ids) + o.max_new_tokens > context and len(messages) - first > 1:
                messages = messages[:first] + messages[first + 1 :]
                dropped += 1
                ids = self._encode(messages, o)
        if len(ids) >= context:
            turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")
            raise ChatError(
                f"the conversation at turn {turn} ({len(messages)} messages) is {len(ids)} "
                f"tokens, beyond the model's context of {context} positions: start a new "
                "conversation (/reset), shorten the messages, or drop the oldest turns "
                "(truncation='drop-oldest')"
            )
        return ids, dropped


def hang_up(remote: Remote) -> None:
    """END the server's session (its cache is freed) and close the connection."""
    remote.end()
    remote.drop()


class StopStrings:
    """Streams text, holding back what could be the start of a stop string; `push` returns
    the text that is final and whether a stop string ended the reply (cut before it)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.text = ""  # everything released so far

    def push(self, text: str, final: bool = False) -> tuple[str, bool]:
        buffer = self.held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.held = buffer[: min(hits)], ""
            self.text += out
            return out, True
        keep = 0 if final else self._partial(buffer)
        out, self.held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
        self.text += out
        return out, False

    def _partial(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buffer)), best, -1):
                if s.startswith(buffer[-n:]):
                    best = n
                    break
        return best
