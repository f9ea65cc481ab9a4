"""`EdgespecError`: the one base of every error edgespec raises for its caller to act on (a bad
bundle, option, prompt, device, template, export or server request; a failed link), each
with a message that names the problem and the fix.

A leaf of the standard library only: an app, and the command line, catch `EdgespecError`
without importing numpy, onnxruntime or the runtime. The errors keep their older bases too
(`ValueError` for bad input), so `except ValueError` still catches them.
"""

from __future__ import annotations


class EdgespecError(Exception):
    """Something edgespec refuses or cannot do; the message says what to change."""
