"""Bearer-token checks for every endpoint, with slowed failures and aggregated logging.

`Gate.allows(headers)` compares the `Authorization` header with the configured token in
constant time; the scheme is case-insensitive (RFC 7235: `bearer`, `Bearer`, `BEARER`).
`Gate.refuse(ip)` is awaited before a 401 goes out: each address that keeps failing waits a
little longer (`step` seconds per recent failure, at most `max_delay`), so guessing tokens is
slow while a typo costs a user a fraction of a second; failures are forgotten after
`window` seconds. Rejections are logged as one WARNING per `window` with their count (a
flood of bad tokens does not flood the log). Memory is bounded: at most `max_addresses`
addresses are remembered.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import OrderedDict
from typing import Any

log = logging.getLogger("edgespec.serve")


class Gate:
    def __init__(
        self,
        token: str | None,
        step: float = 0.05,
        max_delay: float = 1.0,
        window: float = 60.0,
        max_addresses: int = 4096,
    ) -> None:
        self.token = token
        self.step, self.max_delay, self.window = step, max_delay, window
        self.max_addresses = max_addresses
        self.failures: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.unlogged = 0  # rejections since the last log line
        self.logged_at = -float("inf")
        self.rejected = 0  # all rejections so far

    def allows(self, headers: Any) -> bool:
        if not self.token:
            return True
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        ok_scheme = scheme.lower() == "bearer"
        # compare even when the scheme is wrong: the time taken does not depend on the token
        same = hmac.compare_digest(given.strip().encode(), self.token.encode())
        return ok_scheme and same

    def delay(self, address: str) -> float:
        """Seconds the next refusal of `address` waits (and records the failure)."""
        now = time.monotonic()
        count, last = self.failures.pop(address, (0, now))
        count = 1 if now - last > self.window else count + 1
        self.failures[address] = (count, now)
        while len(self.failures) > self.max_addresses:
            self.failures.popitem(last=False)
        return min(self.step * (count - 1), self.max_delay)

    async def admit(self, headers: Any, client: Any) -> bool:
        """`allows(headers)`; a refusal is first slowed and counted (`refuse`), so every
        endpoint answers its 401 the same way."""
        if self.allows(headers):
            return True
        await self.refuse(client_address(client))
        return False

    async def refuse(self, address: str) -> None:
        self.rejected += 1
        self.unlogged += 1
        now = time.monotonic()
        if now - self.logged_at >= self.window:
            log.warning(
                "%d request(s) with a missing or wrong bearer token in the last %gs "
                "(latest from %s)",
                self.unlogged,
                self.window,
                address,
            )
            self.unlogged, self.logged_at = 0, now
        await asyncio.sleep(self.delay(address))


def client_address(scope_client: Any) -> str:
    return scope_client[0] if scope_client else "unknown"
