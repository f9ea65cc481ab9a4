"""Graph sessions over a bundle's ONNX (or static, or Core ML) graphs, the KV caches they write in
place, and the stacks every model in a bundle runs as."""
