"""Parameter names of the decoder ↔ those of Hugging Face's Llama-style checkpoints (Llama, Mistral, Qwen2,
Qwen3 share them): ``layers.3.attn.q_proj.weight`` ↔ ``model.layers.3.self_attn.q_proj.weight``."""

from __future__ import annotations

import re

_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_LAYER_PARTS = {"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight"}


def decoder_hf_name(name: str) -> str:
    """Our parameter name → the Hugging Face one."""
    if name == "lm_head.weight":
        return name
    m = _LAYER.fullmatch(name)
    if m is None:
        return f"model.{name}"  # embed_tokens.weight, norm.weight
    part = _LAYER_PARTS.get(m.group(2)) or m.group(2).replace("attn.", "self_attn.", 1)
    return f"model.layers.{m.group(1)}.{part}"
