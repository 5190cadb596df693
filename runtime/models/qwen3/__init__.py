"""The Qwen3 family (dense): the shared decoder with an RMSNorm over each query and key head before RoPE
(``q_norm``, ``k_norm``), no biases, and a ``head_dim`` of its own (Qwen3's is 128 whatever the width).

A sliding window (``use_sliding_window: true``) and attention biases are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.models.spec import ModelSpec, matmul_parameters

if TYPE_CHECKING:
    from runtime.config import ModelArgs


def _layer_parameters(args: ModelArgs) -> int:
    # q, k, v, o, MLP, two norms, and the two per-head norms
    return matmul_parameters(args) + 2 * args.hidden_size + 2 * args.head_size


def _hf_fields(args: ModelArgs) -> dict:
    return {"model_type": "qwen3", "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": args.num_hidden_layers}


SPEC = ModelSpec(
    name="qwen3",
    title="Qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    hf_requires={"attention_bias": False, "hidden_act": "silu", "use_sliding_window": False},
    hf_fields=_hf_fields,
    hf_head_dim=128,  # Qwen3Config's default: its head_dim is independent of the hidden size
    layer_parameters=_layer_parameters,
    modeling="runtime.models.qwen3.model",
)
