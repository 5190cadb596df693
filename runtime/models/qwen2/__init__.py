"""The Qwen2 family (Qwen2, Qwen2.5): the shared decoder with biases on the q, k and v projections.

Hugging Face's Qwen2 config has no ``attention_bias`` key (the biases are always there); a sliding window
(``use_sliding_window: true``) is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.models.spec import ModelSpec, matmul_parameters

if TYPE_CHECKING:
    from runtime.config import ModelArgs


def _layer_parameters(args: ModelArgs) -> int:
    biases = (args.num_attention_heads + 2 * args.kv_heads) * args.head_size
    return matmul_parameters(args) + biases + 2 * args.hidden_size  # q, k, v (and their biases), o, MLP, two norms


def _hf_fields(args: ModelArgs) -> dict:
    return {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": args.num_hidden_layers}


SPEC = ModelSpec(
    name="qwen2",
    title="Qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    hf_requires={"hidden_act": "silu", "use_sliding_window": False},
    hf_fields=_hf_fields,
    layer_parameters=_layer_parameters,
    modeling="runtime.models.qwen2.model",
)
