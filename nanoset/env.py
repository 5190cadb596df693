"""Numbers the toolkit reads from environment variables: a value that is not one is one line naming it."""

from __future__ import annotations

import os

from nanoset.errors import NanosetError


def env_number(name: str, default: float, kind: type = int, minimum: float | None = None) -> float:
    """``$name`` as ``kind`` (``int`` or ``float``), ``default`` when unset or empty; refused below ``minimum``."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise NanosetError(f"environment variable {name}={value!r} is not {'an integer' if kind is int else 'a number'}"
                           ) from None
    if minimum is not None and number < minimum:
        raise NanosetError(f"environment variable {name}={number} must be ≥ {minimum}")
    return number
