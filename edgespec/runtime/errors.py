"""The errors the runtime raises for a caller to act on (a leaf every runtime module imports).

InputError  a request cannot be served as given; the message says what to change
SplitError  the split-decoding server refused the request (retrying would not help)
ServerLimit the server cannot hold this generation (its context, its request size)
LinkError   the link to the server failed or timed out (it may be fine later)
ServerBusy  the server answered but cannot take the session now (full, or restarting)
RoundLate   the round in flight is past the device's deadline for it (still awaited)
"""

from __future__ import annotations

from edgespec.errors import EdgespecError


class InputError(EdgespecError, ValueError):
    """A generation request cannot be served as given; the message says what to change."""


class SplitError(InputError):
    """The server refused the request; the message says what to change."""


class LinkError(EdgespecError):
    """The link failed or timed out; the server may be fine later."""


class ServerBusy(LinkError):
    """The server is up but refused the session for now (full: 503 / close 1013; stopping:
    close 1012): worth trying again soon, unlike a server that does not answer."""


class ServerLimit(SplitError):
    """The server cannot take this sequence or message (its context or request size)."""


class RoundLate(Exception):
    """The round in flight is late (past `Remote.late_after()`); it is still awaited."""
