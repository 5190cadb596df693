"""TensorPointer: the placeholder a pipeline rank holds for a tensor that lives on another rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorPointer:
    """The tensor is owned by pipeline rank ``group_rank`` (its rank in the pp group)."""

    group_rank: int
