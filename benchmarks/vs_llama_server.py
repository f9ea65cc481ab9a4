"""edgespec's OpenAI endpoint against llama-server's, head to head on the same GGUF file.

Takes a bundle of a real chat model (`--bundle`: what `edgespec export FILE.gguf` or `edgespec
distill FILE.gguf` made) and the GGUF file it came from (`--gguf`), and the llama.cpp build of
`setup_llamacpp.sh` (its `llama-server`). Starts, one at a time, on 127.0.0.1 with `--threads`:

* `edgespec serve BUNDLE --mode M` for each `--modes` entry (`default`: no --mode, what the
  bundle picks);
* `llama-server -m FILE` plain and with each `--spec-types` entry (`ngram-mod`, `ngram-map-k`,
  ...; `draft-simple` needs `--draft-gguf`).

Each server answers the same conversations (benchmarks/lib/instruct.py's workloads: open
questions, code rewriting, summarising, a multi-turn chat; and a JSON extraction) through the
real `openai` client, streamed, greedy (temperature 0), `--max-tokens` each, `--repeats`
passes. Per server and workload: decode tokens/s (the tokens after the first over the time
from the first streamed token to the last, so prefill and connection set-up are out), and
whether the reply text equals edgespec `ar`'s. Every server runs alone on the machine.

    python -m benchmarks.vs_llama_server --bundle B --gguf FILE.gguf --threads 2 \\
        --modes ar,default --spec-types ngram-mod,ngram-map-k --json out.json
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.lib.flags import listed, parser
from benchmarks.lib.instruct import WORKLOADS
from benchmarks.lib.llamacpp import LlamaCppEnv
from benchmarks.lib.machine import cpu_name, load_line, log
from benchmarks.lib.serving import free_port, start_server, stop_server
from benchmarks.lib.tables import table_header, table_row, write_result

JSON_EXTRACTION = [
    [
        {
            "role": "user",
            "content": "Extract the name, age and city from this sentence as a JSON object "
            'with the keys "name", "age" and "city":\n\nMaria Lopez, 34, moved from Seville '
            "to Lyon last spring to work as a nurse.",
        }
    ]
]


def workloads() -> dict[str, list[list[dict[str, str]]]]:
    return {**WORKLOADS, "json": JSON_EXTRACTION}


def start_llama_server(env: LlamaCppEnv, gguf: Path, port: int, threads: int, spec: list[str]):
    import urllib.request

    cmd = [str(env.bin / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port",
           str(port), "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1",
           *spec]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env.subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not become healthy within 120 s")


def chat_rates(port: int, convs: list[list[dict[str, str]]], max_tokens: int) -> list[tuple]:
    """(decode tokens/s, reply text) per conversation, streamed through the openai client."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                           max_retries=0, timeout=300)  # fmt: skip
    out = []
    for messages in convs:
        stream = client.chat.completions.create(
            model="m", messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        pieces, stamps, usage = [], [], None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                stamps.append(time.perf_counter())
        n = usage.completion_tokens if usage is not None else len(pieces)
        rate = (n - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and n > 1 else 0.0
        out.append((rate, "".join(pieces), n))
    return out


def main() -> None:
    a = parser(__doc__)
    a.add_argument("--bundle", type=Path, required=True)
    a.add_argument("--gguf", type=Path, required=True)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--modes", default="ar,default", help="edgespec serve --mode values")
    a.add_argument("--spec-types", default="ngram-mod,ngram-map-k", help="llama-server's")
    a.add_argument("--draft-gguf", type=Path, default=None, help="for --spec-types draft-simple")
    a.add_argument("--max-tokens", type=int, default=128)
    a.add_argument("--repeats", type=int, default=1)
    a.add_argument("--workloads", default=",".join(workloads()))
    a.add_argument("--llamacpp-venv", type=Path, default=Path("/work/venv-llamacpp"))
    a.add_argument("--json", type=Path, default=None)
    args = a.parse_args()
    env = LlamaCppEnv.from_venv(args.llamacpp_venv)
    loads = {w: c for w, c in workloads().items() if w in listed(args.workloads)}
    servers: list[tuple[str, str, list[str]]] = [
        (f"edgespec {m}", "edgespec", [] if m == "default" else ["--mode", m])
        for m in listed(args.modes)
    ]
    servers.append(("llama-server", "llama", []))
    for spec in listed(args.spec_types):
        extra = ["--spec-type", spec]
        if spec == "draft-simple":
            if args.draft_gguf is None:
                raise SystemExit("--spec-types draft-simple needs --draft-gguf")
            extra += ["-md", str(args.draft_gguf)]
        servers.append((f"llama-server {spec}", "llama", extra))
    results: dict[str, dict[str, list]] = {}
    for name, kind, extra in servers:
        port = free_port()
        if kind == "edgespec":
            proc = start_server(args.bundle, port, args.threads, 4, *extra, quiet=True)
        else:
            proc = start_llama_server(env, args.gguf, port, args.threads, extra)
        try:
            for w, convs in loads.items():
                chat_rates(port, convs[:1], 8)  # warm-up
                runs = []
                for _ in range(args.repeats):
                    runs += chat_rates(port, convs, args.max_tokens)
                results.setdefault(name, {})[w] = runs
                log(f"{name} {w}: {statistics.mean(r[0] for r in runs):.1f} tok/s")
        finally:
            if kind == "edgespec":
                stop_server(proc)
            else:
                proc.terminate()
                proc.wait(30)
    ar = results.get("edgespec ar", {})
    print(f"\n{cpu_name()}; {load_line()}; {args.threads} threads; {args.max_tokens} tokens")
    print(table_header(["server", *loads], "l" + "r" * len(loads)))
    for name, per in results.items():
        cells = []
        for w in loads:
            rate = statistics.mean(r[0] for r in per[w])
            same = "" if not ar else (" =" if [r[1] for r in per[w]] == [r[1] for r in ar[w]]
                                      else " ≠")  # fmt: skip
            cells.append(f"{rate:.1f}{same}")
        print(table_row([name, *cells]))
    print("(decode tokens/s; = / ≠: the reply text equals edgespec ar's or not)")
    data = {n: {w: [{"tokens_per_s": r[0], "tokens": r[2], "text": r[1]} for r in runs]
                for w, runs in per.items()} for n, per in results.items()}  # fmt: skip
    write_result(args.json, args, {"servers": data})


if __name__ == "__main__":
    main()
