"""Attention masks, causal and by document, for whole sequences and for a context-parallel rank's part.

One definition decides who may attend to whom (``may_attend``): a query attends to a key at the same
or an earlier **global** position, and with document attention only within its own document.
Documents are found where ``position_ids`` restart at 0 (the same boundaries the data layer restarts
positions at; each padding token of a packed sample is position 0, a document of its own). The
mask is built once per chunk forward from the position ids that travel with the micro-batch (also
through the pipeline) and shared by the chunk's layers.

The definition drives two kernels. On CUDA, for head sizes flex_attention's kernels take (a power
of two ≥ 16), a block mask for the compiled ``flex_attention``: blocks no query of a block may see
are skipped. Elsewhere a boolean ``[batch, 1, queries, keys]`` mask for
``scaled_dot_product_attention``, turned once per chunk forward into the additive mask SDPA would
otherwise make (and keep for the backward) in every layer. Without context parallelism, causal
attention needs no mask at all (SDPA's ``is_causal``). torch's flex backward does not run on CPU,
which is why the CPU trains through SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` index of each token's document within its row (0 for a row's first document)."""
    return (position_ids == 0).cumsum(dim=1) - 1


def may_attend(q_pos: torch.Tensor, kv_pos: torch.Tensor, q_doc: torch.Tensor | None = None,
               kv_doc: torch.Tensor | None = None) -> torch.Tensor:
    """The mask definition (True: may attend), elementwise on broadcastable tensors: global query and key
    positions, and with document attention their document ids."""
    allowed = q_pos >= kv_pos
    if q_doc is not None:
        allowed = allowed & (q_doc == kv_doc)
    return allowed


_FLEX: tuple | None = None  # the compiled flex_attention and create_block_mask, made once for the process
_NO_FLEX = ()  # where torch has none


def _flex():
    """The compiled flex_attention and create_block_mask (one pair for the process: every compiled layer calls
    the same object, which ``use_flex`` makes outside any compiled layer), or None where they are not
    available. Compiled, the block mask is built block by block instead of as a dense [batch, seq, seq]
    tensor, and flex_attention is one fused kernel (eager, it is a full score matrix)."""
    global _FLEX
    if _FLEX is None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            _FLEX = _NO_FLEX
        else:
            _FLEX = (torch.compile(flex_attention, dynamic=False), torch.compile(create_block_mask))
    return _FLEX or None


def use_flex(device: torch.device, head_dim: int) -> bool:
    return device.type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and _flex() is not None


def sdpa_reads_grouped_kv(q: torch.Tensor, mask) -> bool:
    """Whether SDPA takes grouped-query K/V as they are (``enable_gqa``): CUDA's flash kernel does, for causal
    attention without a mask in bf16 or fp16 at head sizes ≤ 256 (a multiple of 8); then no K/V copy is made or
    saved for the backward pass. Elsewhere (CPU, where the grouped form runs 5-9× slower, measured with torch
    2.13; CUDA's memory-efficient kernel for masks and fp32, which has none) K/V are repeated to the query
    heads."""
    head = q.shape[-1]
    return (q.device.type == "cuda" and mask is None and q.dtype in (torch.bfloat16, torch.float16)
            and head <= 256 and head % 8 == 0)


def sequence_mask(q_pos: torch.Tensor, kv_pos: torch.Tensor, q_doc: torch.Tensor | None, kv_doc: torch.Tensor | None,
                  flex: bool, create_block_mask=None):
    """``may_attend`` for queries at global positions ``q_pos`` ``[Sq]`` and keys at ``kv_pos`` ``[Skv]``
    (``q_doc`` ``[batch, Sq]`` and ``kv_doc`` ``[batch, Skv]``: document ids, or None for causal): a flex
    BlockMask (``flex``; ``create_block_mask`` defaults to the compiled one), else a boolean
    ``[batch or 1, 1, Sq, Skv]`` tensor."""
    if flex:
        if create_block_mask is None:
            _, create_block_mask = _flex()

        if q_doc is None:
            def mask_mod(b, h, q, kv):
                return may_attend(q_pos[q], kv_pos[kv])
        else:
            def mask_mod(b, h, q, kv):
                return may_attend(q_pos[q], kv_pos[kv], q_doc[b, q], kv_doc[b, kv])

        batch = None if q_doc is None else q_doc.shape[0]
        return create_block_mask(mask_mod, batch, None, len(q_pos), len(kv_pos), device=q_pos.device)
    if q_doc is None:
        return may_attend(q_pos[:, None], kv_pos[None, :])[None, None]
    return may_attend(q_pos[:, None], kv_pos[None, :], q_doc[:, :, None], kv_doc[:, None, :])[:, None]


def document_mask(position_ids: torch.Tensor, head_dim: int):
    """The attention mask of documents restarting where ``position_ids`` is 0, over a whole sequence: a flex
    BlockMask on CUDA (see ``use_flex``), else a boolean ``[batch, 1, seq, seq]`` tensor (True: may attend)."""
    doc = document_ids(position_ids)
    pos = torch.arange(doc.shape[1], device=doc.device)
    return sequence_mask(pos, pos, doc, doc, use_flex(position_ids.device, head_dim))


def additive(mask, dtype: torch.dtype):
    """A boolean mask as the additive one SDPA applies (0 where allowed, -inf elsewhere), made once for all
    layers; a BlockMask (or None) as it is."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Attention of ``[batch, heads, seq, head_dim]`` tensors: causal when ``mask`` is None, else masked
    (queries and keys may differ in number: a cp rank's queries against the gathered keys).

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention): flex_attention takes them as
    they are, so what its backward keeps (under context parallelism the gathered K/V) stays at the key/value
    heads; SDPA gets them repeated (its grouped-query form runs 5-9× slower on CPU, measured with torch
    2.13, and CUDA's memory-efficient kernel for masks and fp32 has none)."""
    gqa = q.shape[1] != k.shape[1]
    if mask is not None and not isinstance(mask, torch.Tensor):
        flex_attention, _ = _flex()
        return flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
    if gqa:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
