"""The server's bearer-token check, shared by the split-session WebSocket and the OpenAI API.

Takes the server config (its optional token) and a request's headers; True when no token is
configured or the `Authorization: Bearer TOKEN` header matches (constant-time comparison).
"""

from __future__ import annotations

import hmac
from typing import Any


def authorized(config: Any, headers: Any) -> bool:
    if not config.token:
        return True
    given = headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {config.token}".encode())
