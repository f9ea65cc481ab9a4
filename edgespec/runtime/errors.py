"""The errors the runtime raises for a caller to act on (a leaf every runtime module imports).

InputError  a request cannot be served as given; the message says what to change
SplitError  the split-decoding server refused the request (retrying would not help)
LinkError   the link to the server failed or timed out (it may be fine later)
"""

from __future__ import annotations


class InputError(ValueError):
    """A generation request cannot be served as given; the message says what to change."""


class SplitError(InputError):
    """The server refused the request; the message says what to change."""


class LinkError(Exception):
    """The link failed or timed out; the server may be fine later."""
