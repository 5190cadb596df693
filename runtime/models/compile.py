"""``model.compile``: ``torch.compile`` each decoder layer of a chunk, not the whole chunk.

Per layer, as torchtitan does: all layers share one compiled graph (their code is the same and
parameters are graph inputs), so compilation costs one layer whatever the depth, and a pipeline
cut, FSDP's hooks (they stay outside the graph, around each layer's call) and the loss (computed
by the engine, eagerly) are untouched. The forward is compiled in place, so parameter names stay
the same. A new sequence length (a stage switch) compiles once more.
"""

from __future__ import annotations

import torch
from torch import nn


def compile_layers(chunk: nn.Module) -> None:
    """Replace each decoder layer's ``forward`` by its compiled version (after activation checkpointing)."""
    for layer in chunk.layers.values():
        layer.forward = torch.compile(layer.forward, dynamic=False)
