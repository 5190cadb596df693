"""The values a numeric config key may take: a ``Range`` per key, kept in the field's metadata by ``key``, so
``runtime.config.rules`` checks every such key before start-up and ``docs/config.md`` can say what each takes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """The values a numeric key may take (``rules`` checks every key that has one, before start-up)."""

    low: float
    high: float | None = None
    low_open: bool = False  # low itself excluded
    high_open: bool = False

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        low = _number(self.low)
        if self.high is None:
            return f"{'>' if self.low_open else '≥'} {low}"
        return f"in {'(' if self.low_open else '['}{low}, {_number(self.high)}{')' if self.high_open else ']'}"


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"  # an int bound exactly (2**64 - 1, not 1.84467e+19)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
SEED = Range(0, 2**64 - 1)  # what torch.manual_seed takes


def key(default: Any = dataclasses.MISSING, valid: Range = POSITIVE) -> Any:
    """A numeric config key with its valid range."""
    return field(default=default, metadata={"range": valid})
