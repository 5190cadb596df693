"""Activation checkpointing of decoder layers (``model.activation_checkpointing``).

A checkpointed layer keeps only its input from the forward pass and runs its forward again during
the backward pass: activation memory of ``O(layers)`` inputs instead of every intermediate, for
about one more forward. ``full`` checkpoints every layer, ``selective`` every
``activation_checkpointing_every``-th one (global layer indices 0, N, 2N, …, so the choice does not
depend on how the pipeline cuts the model).

The layer's ``forward`` is wrapped in place rather than the module in a ``CheckpointWrapper``, so
parameter names (and checkpoints, and Hugging Face export) are the same whatever the setting.
It is applied after tensor parallelism and before ``torch.compile`` and FSDP, as torchtitan does:
FSDP's hooks then gather the parameters around the whole checkpointed layer, recomputation included.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpointed_layers(num_layers: int, mode: str, every: int) -> set[int]:
    """Global indices of the layers that ``mode`` checkpoints."""
    if mode == "none":
        return set()
    if mode == "full":
        return set(range(num_layers))
    if mode == "selective":
        return set(range(0, num_layers, every))
    raise ValueError(f"model.activation_checkpointing: {mode!r} is not one of none, full, selective")


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # non-reentrant: works with torch.compile and with inputs that need no gradient
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(chunk: nn.Module, num_layers: int, mode: str, every: int) -> list[int]:
    """Checkpoint the chosen layers of ``chunk`` (a ``LlamaChunk``); returns their global indices."""
    chosen = checkpointed_layers(num_layers, mode, every)
    done = []
    for name, layer in chunk.layers.items():
        if int(name) in chosen:
            layer.forward = functools.partial(_checkpointed, layer.forward)
            done.append(int(name))
    return done
