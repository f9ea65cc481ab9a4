"""`edgespec devices`: execution providers here and every device profile."""

from __future__ import annotations

import os

import click

from edgespec.cli.common import _friendly


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
@_friendly
def devices(as_json: bool) -> None:
    """List this onnxruntime build's execution providers and every device profile."""
    import json

    import onnxruntime as ort

    from edgespec.devices.profiles import load_profiles, user_dirs

    providers = ort.get_available_providers()
    profiles = load_profiles()
    if as_json:
        rows = [p.to_dict() | {"available": p.available()} for p in profiles.values()]
        doc = {"onnxruntime": ort.__version__, "providers": providers, "profiles": rows}
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"onnxruntime {ort.__version__}: {', '.join(providers)}")
    click.echo(f"user profiles: {os.pathsep.join(str(d) for d in user_dirs())}\n")
    header = (
        f"{'device':<13} {'here':<5} {'static':<6} {'quant':<8} {'GB/s':>5}  "
        "energy; providers (options)"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for p in profiles.values():
        energy = ", ".join(f"{k}={v:g}" for k, v in p.energy.items()) or "defaults"
        chain = " > ".join(
            name.removesuffix("ExecutionProvider")
            + (" (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")" if opts else "")
            for name, opts in p.providers
        )
        bandwidth = f"{p.memory_bandwidth_gbps:g}" if p.memory_bandwidth_gbps else "-"
        click.echo(
            f"{p.name:<13} {'yes' if p.available() else 'no':<5} "
            f"{'yes' if p.static_shapes else 'no':<6} {p.quantization:<8} {bandwidth:>5}  "
            f"{energy}; {chain}" + ("" if p.source == "built-in" else f"  [{p.source}]")
        )
