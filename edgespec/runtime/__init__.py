"""The runtime: bundle -> tokens, with numpy and onnxruntime only (never torch)."""
