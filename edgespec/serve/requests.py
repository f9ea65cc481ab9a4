"""Numbers in requests, checked once for every endpoint: JSON bodies and START messages.

JSON lets a client send `1e400` (infinity), `NaN`, `Infinity`, `true` where a number goes,
or a temperature so small (1e-320) that logits / temperature overflow. Each getter takes a
parsed JSON object and a field name and returns a value of the right type inside its range,
or raises `FieldError` naming the field, what it got and what it accepts (the HTTP layer
answers 400, the WebSocket layer its bad-request ERROR). Booleans are never numbers here.

`sampling()` validates the sampling fields shared by /v1/completions, the chat endpoints and
START, so every path refuses the same values with the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIN_TEMPERATURE = 1e-3  # below it logits / T overflow float32/float64; 0 means greedy
MAX_TEMPERATURE = 100.0
MAX_SEED = (1 << 64) - 1  # START carries the seed as u64


MAX_INT_DIGITS = 100  # longer JSON integers are past every range: parsed as ±inf, refused by name


def json_int(text: str) -> int | float:
    """`json.loads`' parse_int: an int, or ±inf for one longer than MAX_INT_DIGITS digits (an
    int that long would meet Python's 4,300-digit limit, a ValueError naming no field; as
    inf, the field's own check refuses it by name, as it refuses `1e400`)."""
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else float(text)


class FieldError(ValueError):
    """A request field with a bad value; the message names the field and the fix."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.field = name


def integer(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    """An int in lo..hi (JSON integers only: no floats, bools or strings)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, f"{_show(value)} is not an integer: give a whole number {lo}..{hi}")
    if not lo <= value <= hi:
        raise FieldError(name, f"{value} is outside {lo}..{hi}")
    return value


def number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    """A finite float in [lo, hi] (ints are fine; NaN, ±Infinity, 1e400 and bools are not)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(name, f"{_show(value)} is not a number: give a number in [{lo}, {hi}]")
    value = float(value)
    if not math.isfinite(value):
        raise FieldError(name, f"{_show(value)} is not a finite number: give one in [{lo}, {hi}]")
    if not lo <= value <= hi:
        raise FieldError(name, f"{value:g} is outside [{lo:g}, {hi:g}]")
    return value


def temperature(value: float, name: str = "temperature") -> float:
    """0 (greedy) or a finite temperature in [MIN_TEMPERATURE, MAX_TEMPERATURE]."""
    if not math.isfinite(value) or not (value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
        raise FieldError(
            name,
            f"{value:g} is not 0 (greedy) or a temperature in "
            f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]",
        )
    return value


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


def sampling(body: dict[str, Any], vocab_size: int, default_temperature: float = 1.0) -> Sampling:
    """The sampling fields of a JSON body (OpenAI names), each checked."""
    t = temperature(number(body, "temperature", default_temperature, 0.0, MAX_TEMPERATURE))
    top_p = number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise FieldError("top_p", "0 keeps no token: give a value in (0, 1]")
    top_k = integer(body, "top_k", 0, 0, vocab_size)
    seed = integer(body, "seed", None, 0, MAX_SEED)
    return Sampling(t, top_p, top_k or 0, seed)


def check_start(temperature_: float, top_p: float, top_k: int, vocab_size: int) -> None:
    """The same ranges for a START message's fields (already decoded from the wire)."""
    temperature(temperature_)
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise FieldError("top_p", f"{top_p:g} is outside (0, 1]")
    if not 0 <= top_k <= vocab_size:
        raise FieldError("top_k", f"{top_k} is outside 0..{vocab_size}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
