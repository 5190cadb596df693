"""What the runtime knows of a model family: one ``ModelSpec`` per family, in its folder under ``runtime/models/``.

The engine, the parallelize recipe, the Hugging Face bridge and the metrics ask the spec of the config's
``model.family`` (``runtime/models/registry.py``) and never name a family. The spec itself is torch-free, so that
the config reads a Hugging Face ``config.json`` without torch; its torch side (the chunk class, the
initialisation, the tensor-parallel plan: ``FamilyModules``) is the family's ``model`` module, imported when a
model is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.models.hf_names import decoder_hf_name

if TYPE_CHECKING:
    from runtime.config import ModelArgs


@dataclass(frozen=True)
class Support:
    """The features a family's model takes (each checked against the config before any process starts)."""

    context_parallel: bool = True
    document_masks: bool = True
    tied_embeddings: bool = True


@dataclass(frozen=True)
class FamilyModules:
    """The torch side of a family: ``chunk(args, first_layer, last_layer)`` builds a pipeline chunk of the
    decoder, ``init_weights(chunk, args, seed)`` draws its seeded weights, ``tensor_parallel_plan(chunk)`` maps its
    module names to torch's tensor-parallel styles."""

    chunk: Callable[..., Any]
    init_weights: Callable[[Any, ModelArgs, int], None]
    tensor_parallel_plan: Callable[[Any], dict]


def matmul_parameters(args: ModelArgs) -> int:
    """Weights of one decoder layer's matrix products: q, k, v, o and the SwiGLU MLP's three."""
    h = args.hidden_size
    q = args.num_attention_heads * args.head_size
    kv = args.kv_heads * args.head_size
    return 2 * h * q + 2 * h * kv + 3 * h * args.intermediate_size


@dataclass(frozen=True)
class ModelSpec:
    """One model family.

    ``hf_architectures``: the ``architectures`` of the Hugging Face models it imports (the first is written on
    export); ``hf_requires``: config.json keys whose value must be the one given (absent counts as that value) for
    our model to compute what transformers computes; ``hf_fields(args)``: the family's own config.json fields on
    export (besides the sizes every family writes); ``hf_head_dim``: the ``head_dim`` transformers takes when
    config.json has none (None: hidden_size / num_attention_heads); ``hf_name``: our parameter name → the Hugging Face
    one.
    ``layer_parameters(args)``: every weight of one decoder layer; ``layer_matmul_parameters(args)``: those in
    matrix products (the FLOPs). ``modeling``: the module whose ``MODULES`` is the family's torch side."""

    name: str
    title: str
    hf_architectures: tuple[str, ...]
    hf_requires: Mapping[str, object]
    hf_fields: Callable[[ModelArgs], dict]
    layer_parameters: Callable[[ModelArgs], int]
    modeling: str
    layer_matmul_parameters: Callable[[ModelArgs], int] = matmul_parameters
    hf_name: Callable[[str], str] = decoder_hf_name
    support: Support = field(default_factory=Support)
    hf_head_dim: int | None = None

    def modules(self) -> FamilyModules:
        """The family's torch side (imports torch)."""
        return importlib.import_module(self.modeling).MODULES
