"""The one error of the export side: `ExportError`, a message saying what is wrong and what to do.

In its own module so that every export module can import it at load time without a circle.
"""

from __future__ import annotations

from edgespec.errors import EdgespecError


class ExportError(EdgespecError, ValueError):
    """The checkpoint or the options cannot be exported; the message says why and what to do."""
