"""edgespec: fast, lossless LLM decoding on the device, on onnxruntime.

    import edgespec
    model = edgespec.load("bundle/")          # numpy + onnxruntime only, never torch
    print(model.generate("def fib(n):", max_new_tokens=64).text)
    for piece in model.stream("Once upon a time"):
        print(piece.text, end="", flush=True)

Bundles are made by `edgespec export` (`edgespec.export.export_bundle`, needs [export]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from edgespec.runtime.model import Model


def load(bundle: Any, **options: Any) -> Model:
    """Load a bundle folder for decoding; see `edgespec.runtime.model.Model` for options."""
    from edgespec.runtime.model import Model

    return Model.load(bundle, **options)


__all__ = ["load", "__version__"]
