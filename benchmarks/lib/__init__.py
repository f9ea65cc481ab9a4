"""What the benchmark scenarios share: the machine (facts, load, quiet waits, bandwidth),
timed runs, models (shapes, checkpoints, the trained pair, bundles), engines (edgespec,
transformers, onnxruntime-genai, llama.cpp), a verifier server, flags, tables and plots.

Importing `benchmarks.lib` imports nothing heavy: each module imports torch, transformers or
an engine only inside the function that needs it, and `machine` / `timing` are standard
library only (they also run inside the llama.cpp and onnxruntime-genai worker interpreters).
"""
