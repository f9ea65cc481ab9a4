"""edgespec's benchmarks: `lib/` (what every scenario shares) and one script per scenario.

Run a scenario from the repository root as a module, e.g. `python -m benchmarks.decode`;
`benchmarks/README.md` lists them. Nothing in `edgespec` imports this package.
"""
