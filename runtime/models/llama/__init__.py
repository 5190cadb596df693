"""The Llama family (and Mistral without a sliding window): the decoder as it is, no biases.

Its spec is torch-free; the model's names (``LlamaChunk``, and the shared ``init_weights``, ``rope_tables``, …
that Llama code has always imported from here) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from runtime.models.spec import ModelSpec, matmul_parameters

if TYPE_CHECKING:
    from runtime.config import ModelArgs


def _layer_parameters(args: ModelArgs) -> int:
    return matmul_parameters(args) + 2 * args.hidden_size  # q, k, v, o, MLP, two norms


def _hf_fields(args: ModelArgs) -> dict:
    return {"model_type": "llama", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}


SPEC = ModelSpec(
    name="llama",
    title="Llama",
    hf_architectures=("LlamaForCausalLM", "MistralForCausalLM"),
    hf_requires={"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "sliding_window": None,
                 "pretraining_tp": 1},
    hf_fields=_hf_fields,
    layer_parameters=_layer_parameters,
    modeling="runtime.models.llama.model",
)

_EXPORTS = {
    "LlamaChunk": "runtime.models.llama.model",
    "Attention": "runtime.models.decoder",
    "DecoderLayer": "runtime.models.decoder",
    "MLP": "runtime.models.decoder",
    "RMSNorm": "runtime.models.decoder",
    "apply_rope": "runtime.models.rope",
    "rope_tables": "runtime.models.rope",
    "init_weights": "runtime.models.init",
    "draw_normal_part": "runtime.models.init",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
