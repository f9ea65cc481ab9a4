"""Chat benchmarks: time to first token of turn N with and without cache reuse, and the speed
of replies through `edgespec serve`'s OpenAI endpoints in each decoding mode.

What it measures, on one conversation of `--turns` turns (user messages cut from held-out
text, replies of exactly `--reply-tokens` tokens, greedy):

* TTFT of turn N, in process: a `ChatSession` that keeps its caches (prefills only the new
  messages) vs a fresh session per turn (prefills the whole conversation), on the same
  messages; both equal greedy replies, so the conversations are identical.
* split mode (`--split`), through `edgespec serve` on loopback (`--split-rtt-ms`: through
  `edgespec channel`'s emulator): a split `ChatSession` that resumes its server session each
  turn vs one that ENDs it before every turn, so the server prefills the whole conversation
  again (the device keeps its drafter's caches in both: only the server's prefill differs).
  Per turn: TTFT, positions the server prefilled and kept (its /health counters' change),
  and whether both replies are the same tokens.
* through the server (`--server-modes`): the official `openai` client streams every turn; per
  mode: TTFT of the last turn, decode tokens/s of the replies (tokens after the first / time
  from first to last chunk, summed over turns), cached prompt tokens reported in `usage`, and
  the acceptance of drafted tokens from the server's /health.

Models: `--shape qwen2.5-0.5b` (random weights in the real shape, for timing; built and cached
by `lib.models.checkpoint`), `--checkpoint` (a folder, or builtin:tiny-llama: random weights,
written once) and/or `--trained DIR` (the pair of benchmarks/train_models.py with
exits 2 and 4, for acceptance). A ChatML template is added to each checkpoint's tokenizer
(neither has one). Prints a markdown table; `--json` writes the numbers.

    python -m benchmarks.chat --shape qwen2.5-0.5b --turns 6 --threads 2 \\
        --server-modes ar,lookup
    python -m benchmarks.chat --trained ~/.cache/edgespec-bench/trained \\
        --server-modes ar,spec,self-spec,lookup
    python -m benchmarks.chat --checkpoint builtin:tiny-llama --split --server-modes ''
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import MODELS, checkpoint
from benchmarks.lib.serving import free_port, health, start_server, stop_server
from benchmarks.lib.tables import table, write_result

CACHE = MODELS
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def user_messages(n: int, words: int) -> list[str]:
    """Deterministic user turns: slices of the stdlib's text (as the trained models saw)."""
    import inspect
    import json as stdlib_json

    text = inspect.getsource(stdlib_json.decoder).split()
    return [" ".join(text[i * words : (i + 1) * words]) for i in range(n)]


def chat_bundle(checkpoint: Path, out: Path, draft: Path | None, exits: list[int]) -> Path:
    """Export `checkpoint` with the ChatML template added (cached by the source's mtime)."""
    stamp = out / ".source"
    key = json.dumps([str(checkpoint), str(draft), exits, CHATML])
    if stamp.exists() and stamp.read_text() == key:
        return out
    from transformers import AutoTokenizer

    from edgespec.export import export_bundle

    ckpt = out.parent / (out.name + "-hf")
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.copytree(checkpoint, ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.chat_template = CHATML
    tok.save_pretrained(ckpt)
    export_bundle(ckpt, out, draft=draft, exit_layers=exits, overwrite=True)
    stamp.write_text(key)
    return out


def local_ttft(bundle: Path, users: list[str], reply_tokens: int, threads: int) -> list[dict]:
    import edgespec
    from edgespec.runtime.chat.session import ChatOptions

    model = edgespec.load(bundle, threads=threads)
    options = ChatOptions(max_new_tokens=reply_tokens, temperature=0, ignore_eos=True)
    kept = model.chat_session()
    model.chat_session().reply([{"role": "user", "content": users[0]}], options)  # warm up
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
    rows = []
    for turn, text in enumerate(users, 1):
        messages.append({"role": "user", "content": text})
        times = {}
        # cold: a fresh session (whole prompt prefilled), best of 2; kept: the conversation's
        # own session, once (a repeat would find this very prompt cached)
        for label, session in (
            ("cold", model.chat_session()),
            ("cold", model.chat_session()),
            ("kept", kept),
        ):
            start = time.perf_counter()
            stream = session.stream(messages, options)
            next(stream)
            elapsed = time.perf_counter() - start
            times[label] = min(times.get(label, elapsed), elapsed)
            if label == "cold":
                stream.close()  # only its first token is timed
                continue
            for _ in stream:
                pass
        reply = kept.last
        assert reply is not None
        rows.append(
            {
                "turn": turn,
                "prompt_tokens": reply.prompt_tokens,
                "cached_tokens": reply.cached_tokens,
                "ttft_cold_s": times["cold"],
                "ttft_kept_s": times["kept"],
            }
        )
        messages.append({"role": "assistant", "content": reply.text})
    return rows


def serve_modes(
    bundle: Path,
    users: list[str],
    reply_tokens: int,
    threads: int,
    modes: list[str],
    policy: str | None = None,
) -> list[dict]:
    import openai

    rows = []
    for mode in modes:
        port = free_port()
        extra = ["--mode", mode]
        if policy and mode != "ar":
            extra += ["--draft-policy", policy]
        server = start_server(bundle, port, threads, 8, *extra)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=600)
            messages: list[dict[str, str]] = [
                {"role": "system", "content": "You are a helpful assistant."}
            ]
            decode_tokens, decode_s, ttft, cached = 0, 0.0, 0.0, 0
            for text in users:
                messages.append({"role": "user", "content": text})
                start, first, last, pieces, usage = time.perf_counter(), None, 0.0, [], None
                for chunk in client.chat.completions.create(
                    model="m",
                    messages=messages,
                    max_tokens=reply_tokens,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                ):
                    now = time.perf_counter()
                    if chunk.usage is not None:
                        usage = chunk.usage
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first if first is not None else now
                        last = now
                        pieces.append(chunk.choices[0].delta.content)
                assert usage is not None and first is not None
                ttft = first - start
                cached = usage.prompt_tokens_details.cached_tokens
                decode_tokens += usage.completion_tokens - 1
                decode_s += last - first
                messages.append({"role": "assistant", "content": "".join(pieces)})
            h = health(port, 30)["openai"]
            rows.append(
                {
                    "mode": mode,
                    "last_turn_ttft_s": ttft,
                    "last_turn_cached_tokens": cached,
                    "last_turn_prompt_tokens": usage.prompt_tokens,
                    "decode_tok_s": decode_tokens / decode_s if decode_s else 0.0,
                    "drafted": h["drafted"],
                    "accepted": h["accepted"],
                }
            )
        finally:
            stop_server(server)
    base = next((r["decode_tok_s"] for r in rows if r["mode"] == "ar"), None)
    for r in rows:
        r["speedup_vs_ar"] = r["decode_tok_s"] / base if base else None
    return rows


def server_counters(port: int) -> dict[str, int]:
    """What split STARTs made the server prefill and keep so far (its /health)."""
    h = health(port, 30)
    return {k: h[k] for k in ("positions_prefilled", "positions_kept")}


def split_turn(session, messages: list[dict], options, port: int, whole: bool = True) -> dict:
    """One split turn: TTFT (the request to the first chunk), the reply's tokens and what the
    server prefilled and kept for it; `whole=False` stops after the first chunk."""
    before = server_counters(port)
    start = time.perf_counter()
    stream = session.stream(messages, options)
    next(stream)
    ttft = time.perf_counter() - start
    if not whole:
        stream.close()
        return {"ttft_s": ttft}
    for _ in stream:
        pass
    after = server_counters(port)
    return {"ttft_s": ttft, "reply": session.last} | {k: after[k] - before[k] for k in before}


def split_ttft(
    bundle: Path,
    users: list[str],
    reply_tokens: int,
    threads: int,
    drafter: str | None = None,
    rtt_ms: float = 0.0,
) -> list[dict]:
    """Per turn of one conversation in split mode (a fresh `edgespec serve`, optionally behind
    the channel emulator): the resumed and the fresh session's TTFT and server counters."""
    import edgespec
    from edgespec.runtime.chat.session import ChatOptions
    from edgespec.tools.channel import Channel, ChannelConfig

    port = free_port()
    server = start_server(bundle, port, threads, 4, "--mode", "ar")
    try:
        with contextlib.ExitStack() as stack:
            address = f"127.0.0.1:{port}"
            if rtt_ms:
                channel = Channel(address, ChannelConfig(rtt_ms=rtt_ms))
                address = stack.enter_context(channel).address
            extra = {"drafter": drafter} if drafter else {}
            model = edgespec.load(
                bundle, mode="split", server=f"ws://{address}", threads=threads, **extra
            )
            options = ChatOptions(max_new_tokens=reply_tokens, temperature=0, ignore_eos=True)
            resumed, fresh = model.chat_session(), model.chat_session()
            for session in (resumed, fresh):  # connect, and pay first-call costs, untimed
                session.reply([{"role": "user", "content": users[0]}], options)
                session.reset()  # ENDs the server session, keeps the connection
            messages: list[dict[str, str]] = [
                {"role": "system", "content": "You are a helpful assistant."}
            ]
            rows = []
            for turn, text in enumerate(users, 1):
                messages.append({"role": "user", "content": text})
                # fresh: END the server session (a new START prefills every position; the
                # device's caches and connection stay), best of 2 as in local_ttft; resumed:
                # once (a repeat would find this very prompt kept)
                assert fresh.remote is not None
                fresh.remote.end()
                cold = split_turn(fresh, messages, options, port)
                fresh.remote.end()
                again = split_turn(fresh, messages, options, port, whole=False)
                kept = split_turn(resumed, messages, options, port)
                reply = kept["reply"]
                rows.append(
                    {
                        "turn": turn,
                        "prompt_tokens": reply.prompt_tokens,
                        "fresh_prefilled": cold["positions_prefilled"],
                        "fresh_kept": cold["positions_kept"],
                        "resumed_prefilled": kept["positions_prefilled"],
                        "resumed_kept": kept["positions_kept"],
                        "ttft_fresh_s": min(cold["ttft_s"], again["ttft_s"]),
                        "ttft_resumed_s": kept["ttft_s"],
                        "same_reply": reply.tokens == cold["reply"].tokens,
                    }
                )
                messages.append({"role": "assistant", "content": reply.text})
            resumed.close()
            fresh.close()
        return rows
    finally:
        stop_server(server)


def print_split(rows: list[dict], rtt_ms: float) -> None:
    channel = f", {rtt_ms:g} ms RTT" if rtt_ms else ", loopback"
    print(f"\nsplit mode{channel}: server prefilled / kept positions, TTFT\n")
    columns = ["turn", "prompt tokens", "fresh session", "resumed", "TTFT, fresh",
               "TTFT, resumed", "ratio", "same reply"]  # fmt: skip
    print(table(columns, "rrrrrrrc", [
        [r["turn"], r["prompt_tokens"], f"{r['fresh_prefilled']} / {r['fresh_kept']}",
         f"{r['resumed_prefilled']} / {r['resumed_kept']}", f"{r['ttft_fresh_s'] * 1000:.0f} ms",
         f"{r['ttft_resumed_s'] * 1000:.0f} ms",
         f"{r['ttft_fresh_s'] / r['ttft_resumed_s']:.1f}x" if r["ttft_resumed_s"] else "-",
         "yes" if r["same_reply"] else "NO"] for r in rows
    ]))  # fmt: skip


def print_tables(title: str, local: list[dict], served: list[dict]) -> None:
    print(f"\n### {title}\n")
    if local:
        print("| turn | prompt tokens | cached | TTFT, full prefill | TTFT, cache kept | ratio |")
        print("|---:|---:|---:|---:|---:|---:|")
    for r in local:
        ratio = r["ttft_cold_s"] / r["ttft_kept_s"] if r["ttft_kept_s"] else 0
        print(
            f"| {r['turn']} | {r['prompt_tokens']} | {r['cached_tokens']} | "
            f"{r['ttft_cold_s'] * 1000:.0f} ms | {r['ttft_kept_s'] * 1000:.0f} ms | {ratio:.1f}x |"
        )
    if served:
        print(
            "\n| server mode | last-turn TTFT | cached / prompt | decode tok/s | vs ar"
            " | acceptance |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for r in served:
            acc = f"{r['accepted'] / r['drafted']:.0%} of {r['drafted']}" if r["drafted"] else "-"
            speed = f"{r['speedup_vs_ar']:.2f}x" if r["speedup_vs_ar"] else "-"
            print(
                f"| {r['mode']} | {r['last_turn_ttft_s'] * 1000:.0f} ms | "
                f"{r['last_turn_cached_tokens']} / {r['last_turn_prompt_tokens']} | "
                f"{r['decode_tok_s']:.1f} | {speed} | {acc} |"
            )


def main(argv: list[str] | None = None) -> None:
    p = flags.parser(__doc__)
    p.add_argument("--shape", default=None, help="qwen2.5-0.5b (random weights, timing)")
    p.add_argument("--trained", type=Path, default=None, help="train_models.py output folder")
    p.add_argument(
        "--checkpoint", default=None, help="an HF checkpoint folder, or builtin:tiny-llama"
    )
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--user-words", type=int, default=60, help="words per user message")
    p.add_argument("--reply-tokens", type=int, default=32)
    p.add_argument("--server-modes", default="ar", help="comma list; empty: no server runs")
    p.add_argument("--server-policy", default=None, help="serve --draft-policy (default auto)")
    p.add_argument("--skip-local", action="store_true", help="only the server measurements")
    p.add_argument("--split", action="store_true", help="split mode: resumed vs fresh sessions")
    p.add_argument("--split-drafter", default=None, help="split drafter (default: the best)")
    p.add_argument("--split-rtt-ms", type=float, default=0.0, help="via the channel emulator")
    flags.add_common(p)
    args = p.parse_args(argv)
    print(load_line(), flush=True)
    users = user_messages(args.turns, args.user_words)
    modes = [m for m in args.server_modes.split(",") if m]
    out: dict[str, Any] = {}
    targets = []
    if args.shape:
        ckpt = checkpoint(args.shape)
        bundle = chat_bundle(ckpt, CACHE / f"chat-{args.shape}", None, [])
        targets.append((f"{args.shape} shape, random weights", bundle))
    if args.trained:
        bundle = chat_bundle(
            args.trained / "target", CACHE / "chat-trained", args.trained / "draft", [2, 4]
        )
        targets.append(("trained pair (train_models.py)", bundle))
    if args.checkpoint:
        from edgespec.export.builtin import BUILTIN_PREFIX, builtin_checkpoint

        ckpt = Path(args.checkpoint)
        if args.checkpoint.startswith(BUILTIN_PREFIX):
            ckpt = builtin_checkpoint(args.checkpoint)  # random weights, written once
        bundle = chat_bundle(ckpt, CACHE / f"chat-{ckpt.name}", None, [])
        targets.append((args.checkpoint, bundle))
    for title, bundle in targets:
        local = (
            [] if args.skip_local else local_ttft(bundle, users, args.reply_tokens, args.threads)
        )
        served = serve_modes(
            bundle, users, args.reply_tokens, args.threads, modes, args.server_policy
        )
        split = (
            split_ttft(
                bundle,
                users,
                args.reply_tokens,
                args.threads,
                args.split_drafter,
                args.split_rtt_ms,
            )
            if args.split
            else []
        )
        out[title] = {"local": local, "served": served, "split": split}
        print_tables(title, local, served)
        if split:
            print_split(split, args.split_rtt_ms)
    print(f"\n{load_line()}")
    write_result(args.json, args, {"targets": out})


if __name__ == "__main__":
    main()
