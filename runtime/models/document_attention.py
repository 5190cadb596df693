"""Document-masked causal attention: a token attends only to earlier tokens of its own document.

Documents are found where ``position_ids`` restart at 0 (the same boundaries the data layer
restarts positions at; each padding token of a packed sample is position 0, a document of its
own). The mask is built once per chunk forward from the position ids that travel with the
micro-batch (also through the pipeline), and shared by the chunk's layers. On CUDA, for head sizes
flex_attention's kernels take (a power of two ≥ 16), it is a block mask for the compiled
``flex_attention`` (blocks of other documents are skipped); elsewhere a boolean
``[batch, 1, seq, seq]`` mask for ``scaled_dot_product_attention``.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` index of each token's document within its row (0 for a row's first document)."""
    return (position_ids == 0).cumsum(dim=1) - 1


@lru_cache(maxsize=1)
def _flex():
    """The compiled flex_attention and create_block_mask, or None where they are not available."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    # compiled, the block mask is built block by block instead of as a dense [batch, seq, seq] tensor
    return torch.compile(flex_attention, dynamic=False), torch.compile(create_block_mask)


def use_flex(device: torch.device, head_dim: int) -> bool:
    return device.type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and _flex() is not None


def document_mask(position_ids: torch.Tensor, head_dim: int):
    """The attention mask of documents restarting where ``position_ids`` is 0: a flex BlockMask on CUDA
    (see ``use_flex``), else a boolean ``[batch, 1, seq, seq]`` tensor (True: may attend)."""
    doc = document_ids(position_ids)
    if use_flex(position_ids.device, head_dim):
        _, create_block_mask = _flex()

        def mask_mod(b, h, q, kv):
            return (doc[b, q] == doc[b, kv]) & (q >= kv)

        b, s = doc.shape
        return create_block_mask(mask_mod, b, None, s, s, device=position_ids.device)
    s = doc.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=doc.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Attention of ``[batch, heads, seq, head_dim]`` tensors: causal when ``mask`` is None, else masked."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    flex_attention, _ = _flex()
    return flex_attention(q, k, v, block_mask=mask)
