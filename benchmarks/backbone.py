"""Shared-backbone edge drafts against an evolving cloud target, and exit adapters, in one run.

Uses the trained benchmark target (`benchmarks/train_models.py`, ~/.cache/edgespec-bench/
trained or EDGESPEC_BENCH). It:

1. evolves the target: fine-tunes only its layers >= K (and the final norm; embeddings, tied
   LM head and layers < K frozen) on different text, the standard library's own test suite
   (`Lib/test/test_*.py`, which the benchmark models never saw), for a fixed number of steps
   with a fixed seed (cached under ~/.cache/edgespec-bench/backbone/evolved);
2. exports (cached): cloud bundles of the original and the evolved target; a frozen
   shared-backbone edge bundle cut from the original at K, plain and with an exit adapter
   fitted on stdlib training-split code; and the edge bundle one would re-export (and
   download) after the update, cut from the evolved target with its own adapter;
3. serves both targets (`edgespec serve`, loopback, one thread each) and measures greedy
   split decoding with each edge bundle against each target, fixed γ, the same prompts
   interleaved config by config: tokens per verification round, acceptance, decode tokens/s
   (and cloud-only γ = 0 as the baseline), checking every output equals the target's own
   greedy output; bytes a device must download after the update in each case;
4. exit adapters: local self-speculation on the original target at exits 2 and 4, plain
   shared-head exit vs the fitted adapter (acceptance, tokens/s), with the fit's KL.

    python -m benchmarks.backbone                   # K=4, 8 prompts x 64 tokens
    python -m benchmarks.backbone --backbone-layers 2 --prompts 4
    python -m benchmarks.backbone --evolve-steps 5 --adapter-steps 5 --prompts 1 --new-tokens 16

Prints markdown tables. tokens/s on a shared machine is noisy: compare ratios from one run.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from pathlib import Path

import numpy as np

import edgespec
from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import MODELS, cached_bundle, load_prompts, stdlib_sources, trained_pair
from benchmarks.lib.serving import free_port, start_server, stop_server
from benchmarks.lib.tables import write_result
from edgespec.bundle import load_manifest
from edgespec.tools.channel import Channel, ChannelConfig

SEED = 0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------ evolve the target
def evolve_text(chars: int = 3_000_000) -> str:
    """The stdlib test suite (Python code of another kind than the training split): the
    first ~`chars` characters of its test_*.py files, in sorted order (~750k tokens)."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "test"
    parts, size = [], 0
    for path in sorted(root.glob("test_*.py")):
        parts.append(path.read_text(errors="replace"))
        size += len(parts[-1])
        if size >= chars:
            break
    return "\n".join(parts)


def calibration_text(out: Path, tokens: int = 20000) -> Path:
    """Stdlib code from the models' training split (their own kind of text), ~`tokens`."""
    path = out / "calibration.txt"
    if path.exists():
        return path
    train, _ = stdlib_sources()
    names = sorted(train, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    chunks, size = [], 0
    for name in names:
        chunks.append(train[name])
        size += len(train[name]) // 4  # ~4 characters per token
        if size > tokens:
            break
    path.write_text("\n".join(chunks))
    return path


def evolve(target: Path, out: Path, k: int, steps: int, seq_len: int = 256, batch: int = 4) -> Path:
    """Fine-tune layers >= k and the final norm of `target` on the test-suite text."""
    config = {"target": str(target), "k": k, "steps": steps, "seq": seq_len, "batch": batch}
    config["target_sha"] = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    info = out / "evolve_info.json"
    if info.exists() and json.loads(info.read_text())["config"] == config:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"evolving the target: {steps} steps on layers >= {k} (stdlib test suite text)")
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(target)
    ids = np.asarray(tok(evolve_text(), add_special_tokens=False)["input_ids"], np.int64)
    trainable = [*model.model.layers[k:].parameters(), *model.model.norm.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(trainable, lr=5e-4, weight_decay=0.0)
    rng = np.random.default_rng(SEED)
    losses = []
    model.train()
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = 5e-4 * 0.5 * (1 + np.cos(np.pi * step / steps))
        starts = rng.integers(0, len(ids) - seq_len - 1, batch)
        x = torch.from_numpy(np.stack([ids[s : s + seq_len] for s in starts]))
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            log(f"  step {step + 1}/{steps} loss {np.mean(losses[-25:]):.3f}")
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    info.write_text(
        json.dumps(
            {
                "config": config,
                "first_loss": losses[0],
                "last_loss": float(np.mean(losses[-10:])),
                "seconds": time.time() - t0,
            },
            indent=2,
        )  # fmt: skip
    )
    return out


def export(src: Path, out: Path, **options) -> Path:
    if not (out / "manifest.json").exists():
        log(f"exporting {out.name}")
    cached_bundle(src, out, **options)
    return out


def bundle_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# ---------------------------------------------------------------------------- measurement
def run(model, prompts: list[str], n: int, refs: list[list[int]] | None) -> dict:
    tokens = rounds = drafted = accepted = 0
    seconds = 0.0
    lossless = True
    for i, prompt in enumerate(prompts):
        out = model.generate(prompt, max_new_tokens=n, ignore_eos=True)
        s = out.stats
        tokens, seconds = tokens + s.decode_tokens, seconds + s.decode_seconds
        rounds, drafted, accepted = rounds + s.rounds, drafted + s.drafted, accepted + s.accepted
        if refs is not None:
            lossless &= out.tokens == refs[i]
    return {
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "tokens_per_round": tokens / rounds if rounds else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "lossless": lossless,
    }


def interleaved(configs: dict, prompts: list[str], n: int, refs: dict) -> dict[str, dict]:
    """Each prompt through every config in turn, so load changes hit all configs alike."""
    parts: dict[str, list[dict]] = {name: [] for name in configs}
    for prompt in prompts:
        for name, (model, target) in configs.items():
            ref = [refs[target][prompts.index(prompt)]] if target else None
            parts[name].append(run(model, [prompt], n, ref))
    merged = {}
    for name, rows in parts.items():
        merged[name] = {
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rows])),
            "tokens_per_round": float(np.mean([r["tokens_per_round"] for r in rows])),
            "acceptance": float(np.mean([r["acceptance"] for r in rows])),
            "lossless": all(r["lossless"] for r in rows),
        }
    return merged


def main(argv: list[str] | None = None) -> None:
    p = flags.parser(__doc__)
    p.add_argument("--models", type=Path, default=MODELS)
    p.add_argument("--backbone-layers", type=int, default=4)
    p.add_argument("--evolve-steps", type=int, default=80)
    p.add_argument("--adapter-steps", type=int, default=300)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--exits", default="2,4", help="exit layers of the adapter table")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="emulated link (0: loopback)")
    p.add_argument("--bandwidth-mbit", type=float, default=None, help="with --rtt-ms")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    print(load_line(), flush=True)
    k = args.backbone_layers
    trained = trained_pair(args.models / "trained")
    target = trained / "target"
    work = args.models / "backbone"
    work.mkdir(parents=True, exist_ok=True)
    calib = calibration_text(work)
    evolved = evolve(target, work / f"evolved-k{k}", k, args.evolve_steps)
    exits = [int(e) for e in args.exits.split(",")]
    fit = dict(fit_exit_adapter=calib, adapter_steps=args.adapter_steps)
    sb = dict(variant="shared-backbone", backbone_layers=k)
    b = {
        "cloud-original": export(target, work / "cloud-original"),
        "cloud-evolved": export(evolved, work / f"cloud-evolved-k{k}"),
        "edge-plain": export(target, work / f"edge-k{k}", **sb),
        "edge-adapter": export(target, work / f"edge-k{k}-adapter", **sb, **fit),
        "edge-reexport": export(evolved, work / f"edge-k{k}-evolved-adapter", **sb, **fit),
        "target+draft": export(target, work / "target-draft", draft=trained / "draft"),
        "draft-only": export(trained / "draft", work / "draft-only"),
        "exits-plain": export(target, work / "exits-plain", exit_layers=exits),
        "exits-adapter": export(target, work / "exits-adapter", exit_layers=exits, **fit),
    }
    prompts = load_prompts(trained / "prompts_code.jsonl", args.prompts)
    n = args.new_tokens
    log("greedy references (ar, local)")
    refs = {
        t: [
            edgespec.load(b[f"cloud-{t}"], threads=1)
            .generate(q, max_new_tokens=n, ignore_eos=True)
            .tokens
            for q in prompts
        ]
        for t in ("original", "evolved")
    }
    servers, results = {}, {}
    channels = []
    try:
        for t in ("original", "evolved"):
            port = free_port()
            proc = start_server(b[f"cloud-{t}"], port, 1, 16)
            address = f"127.0.0.1:{port}"
            if args.rtt_ms:  # an emulated link in front of the server (edgespec.tools.channel)
                config = ChannelConfig(rtt_ms=args.rtt_ms, bandwidth_mbit=args.bandwidth_mbit)
                channels.append(Channel(address, config).start())
                address = channels[-1].address
            servers[t] = (proc, f"ws://{address}")
        configs = {}
        for t in ("original", "evolved"):
            url = servers[t][1]
            for edge in ("edge-plain", "edge-adapter", "edge-reexport"):
                m = edgespec.load(
                    b[edge], mode="split", server=url, threads=1,
                    draft_policy=f"fixed:{args.gamma}",
                )  # fmt: skip
                configs[f"{t}|{edge}"] = (m, t)
            # the separately distilled draft model, kept on the device as the target evolves
            m = edgespec.load(
                b["target+draft"], mode="split", server=url, threads=1, drafter="draft",
                draft_policy=f"fixed:{args.gamma}", local_fallback=False,
            )  # fmt: skip
            configs[f"{t}|draft"] = (m, t)
            cloud = edgespec.load(
                b["edge-plain"], mode="split", server=url, threads=1, draft_policy="fixed:0"
            )
            configs[f"{t}|cloud-only"] = (cloud, t)
        log(f"split decoding: {len(configs)} configs x {len(prompts)} prompts x {n} tokens")
        results["split"] = interleaved(configs, prompts, n, refs)
    finally:
        for ch in channels:
            ch.stop()
        for proc, _ in servers.values():
            stop_server(proc)
    log("self-speculation: plain exit vs exit adapter")
    local = {}
    for e in exits:
        for kind in ("plain", "adapter"):
            m = edgespec.load(
                b[f"exits-{kind}"], mode="self-spec", exit_layer=e, threads=1,
                draft_policy=f"fixed:{args.gamma}",
            )  # fmt: skip
            local[f"{e}|{kind}"] = (m, "original")
    ar = edgespec.load(b["cloud-original"], threads=1)
    local["ar"] = (ar, "original")
    results["adapter"] = interleaved(local, prompts, n, refs)
    results["bytes"] = {name: bundle_bytes(folder) for name, folder in b.items()}
    results["fits"] = {
        name: load_manifest(b[name]).extra.get("exit_adapters", {})
        for name in ("edge-adapter", "edge-reexport", "exits-adapter")
    }
    results["evolve"] = json.loads((evolved / "evolve_info.json").read_text())
    print(tables(results, k, args))
    print(load_line())
    write_result(args.json, args, results)


def tables(r: dict, k: int, args) -> str:
    s, by = r["split"], r["bytes"]
    ev = r["evolve"]
    lines = [
        f"### Frozen shared-backbone edge draft (K={k}) vs an evolved target "
        f"(greedy, γ={args.gamma}, {args.prompts} prompts x {args.new_tokens} tokens, "
        + (f"RTT {args.rtt_ms:g} ms" if args.rtt_ms else "loopback")
        + (f", {args.bandwidth_mbit:g} Mbit/s)" if args.bandwidth_mbit else ")"),
        "",
        f"Evolved target: layers {k}..7 + final norm fine-tuned {ev['config']['steps']} steps "
        f"on the stdlib test suite (loss {ev['first_loss']:.2f} -> {ev['last_loss']:.2f}).",
        "",
        "| target | edge draft | download after update | tokens/round | acceptance "
        "| tokens/s | vs cloud-only | lossless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "edge-plain": "frozen, plain exit",
        "edge-adapter": "frozen, exit adapter",
        "edge-reexport": "re-exported from evolved + adapter",
        "draft": "separate distilled draft (2 layers), kept",
        "cloud-only": "none (cloud-only, γ=0)",
    }
    for t in ("original", "evolved"):
        base = s[f"{t}|cloud-only"]["tokens_per_s"]
        for edge in ("edge-plain", "edge-adapter", "edge-reexport", "draft", "cloud-only"):
            x = s[f"{t}|{edge}"]
            if edge == "cloud-only":
                dl = "0"
            elif edge == "draft":
                dl = f"0 (re-distilled: {by['draft-only'] / 2**20:.1f} MiB)"
            elif edge == "edge-reexport":
                dl = f"{by[edge] / 2**20:.1f} MiB"
            else:
                dl = "0 (kept)"
            lines.append(
                f"| {t} | {names[edge]} | {dl} | {x['tokens_per_round']:.2f} | "
                f"{x['acceptance']:.0%} | {x['tokens_per_s']:.1f} | "
                f"{x['tokens_per_s'] / base:.2f}x | {x['lossless']} |"
            )
    lines += [
        "",
        f"Edge bundle sizes: frozen plain {by['edge-plain'] / 2**20:.1f} MiB, frozen + adapter "
        f"{by['edge-adapter'] / 2**20:.1f} MiB, re-export {by['edge-reexport'] / 2**20:.1f} "
        f"MiB; the whole target bundle {by['cloud-original'] / 2**20:.1f} MiB.",
        "",
        f"### Exit adapters: self-speculation on the original target (γ={args.gamma})",
        "",
        "| exit | head | KL to final (held-out calib) | top-1 vs final | tokens/round "
        "| acceptance | tokens/s | vs ar | lossless |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    a = r["adapter"]
    fits = r["fits"]["exits-adapter"]
    ar = a["ar"]["tokens_per_s"]
    for key, x in a.items():
        if key == "ar":
            continue
        e, kind = key.split("|")
        f = fits.get(e, {})
        before = kind == "plain"
        kl = f.get("kl_before" if before else "kl_after", float("nan"))
        top1 = f.get("top1_before" if before else "top1_after", float("nan"))
        lines.append(
            f"| {e} | {'shared LM head' if before else 'adapter'} | {kl:.3f} | {top1:.0%} | "
            f"{x['tokens_per_round']:.2f} | {x['acceptance']:.0%} | {x['tokens_per_s']:.1f} | "
            f"{x['tokens_per_s'] / ar:.2f}x | {x['lossless']} |"
        )
    lines.append(f"| - | ar | | | 1.00 | | {ar:.1f} | 1.00x | {a['ar']['lossless']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
