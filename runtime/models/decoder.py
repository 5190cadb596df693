"""The Llama-style decoder every family builds on (RMSNorm, RoPE, SwiGLU, grouped-query attention with causal or
document masks) that splits into pipeline chunks. A family changes what it must by subclassing: its attention
(``DecoderChunk.attention``; ``Attention.heads`` makes the heads, ``Attention.qkv_bias`` adds biases) and its
chunk class, in its own folder.

A chunk owns a contiguous range of layers, kept in a ModuleDict under their global index, so
parameter names (``layers.7.attn.q_proj.weight``) are the same in every layout: initialisation
and checkpoints do not depend on how the model is cut. The first chunk embeds, the last one
normalises and projects to the vocabulary; inner chunks pass ``(hidden, position_ids)`` on.

With context parallelism (``context_parallel`` set by the parallelize recipe) a chunk sees this cp
rank's tokens only, their position ids being the global ones (so RoPE is unchanged); attention
gathers the keys and values of the whole sequence and masks them by global positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.config import ModelArgs
from runtime.models.document_attention import additive, attend, document_ids, document_mask, sequence_mask, use_flex
from runtime.models.rope import apply_rope, rope_tables
from runtime.parallel.context_parallel import ContextParallel


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    qkv_bias = False  # biases on the q, k and v projections (o_proj never has one)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.head_dim = args.head_size
        bias = self.qkv_bias
        self.q_proj = nn.Linear(args.hidden_size, args.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, args.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, args.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(args.num_attention_heads * self.head_dim, args.hidden_size, bias=False)
        self.context_parallel: ContextParallel | None = None

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, ``[batch, seq, heads, head_dim]``, before RoPE; the head counts come from the
        (possibly tensor-parallel, local) projections."""
        b, s, _ = x.shape
        return tuple(proj(x).view(b, s, -1, self.head_dim) for proj in (self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.heads(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.context_parallel is not None:  # the keys and values of the whole sequence, one gather
            k, v = self.context_parallel.gather(torch.stack((k, v), dim=2)).unbind(dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = attend(q, k, v, mask)  # k and v keep their fewer heads (grouped-query attention)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, attention: type[Attention] = Attention) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.attn = attention(args)
        self.mlp_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class DecoderChunk(nn.Module):
    """Layers ``[first_layer, last_layer)`` of the model, plus embedding and/or head at the ends."""

    attention: type[Attention] = Attention  # a family's attention

    def __init__(self, args: ModelArgs, first_layer: int = 0, last_layer: int | None = None) -> None:
        super().__init__()
        last_layer = args.num_hidden_layers if last_layer is None else last_layer
        self.args = args
        self.has_embedding = first_layer == 0
        self.has_head = last_layer == args.num_hidden_layers
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size) if self.has_embedding else None
        self.layers = nn.ModuleDict({str(i): DecoderLayer(args, self.attention)
                                     for i in range(first_layer, last_layer)})
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps) if self.has_head else None
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False) if self.has_head else None
        if args.tie_word_embeddings and self.has_embedding and self.has_head:
            self.lm_head.weight = self.embed_tokens.weight
        # tied, but the embedding is on another pipeline stage: this head is a copy of it, kept equal
        # (runtime/parallel/tied_embedding.py) and stored, initialised and loaded under its name
        self.head_copies_embedding = args.tie_word_embeddings and self.has_head and not self.has_embedding
        self.context_parallel: ContextParallel | None = None  # this chunk sees a cp rank's tokens only

    def materialize(self, device: torch.device) -> None:
        """Allocate this rank's shards on ``device`` for a chunk built on the meta device (and already
        sharded), so that no rank ever holds the whole model. ``to_empty`` turns a plain tied
        parameter into two tensors: the head is tied to the embedding again."""
        self.to_empty(device=device)
        if self.has_embedding and self.has_head and self.args.tie_word_embeddings:
            if self.lm_head.weight is not self.embed_tokens.weight:
                self.lm_head.weight = self.embed_tokens.weight

    def stored_name(self, name: str) -> str:
        """The layout-independent name of parameter ``name``: the head copy of a tied embedding is
        ``embed_tokens.weight`` (in checkpoints, initialisation and Hugging Face files)."""
        return "embed_tokens.weight" if self.head_copies_embedding and name == "lm_head.weight" else name

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None):
        """``x``: token ids on the first chunk, hidden states elsewhere. Returns logits on the last
        chunk, else ``(hidden, position_ids)`` for the next one."""
        if self.embed_tokens is not None:
            if position_ids is None:
                position_ids = self._token_positions(x.shape[1], x.device).expand(x.shape[0], -1)
            x = self.embed_tokens(x)
        rope_dtype = torch.float32 if self.args.rope_fp32 else x.dtype
        cos, sin = rope_tables(position_ids, self.args.head_size, self.args.rope_theta, rope_dtype,
                               self.args.rope_scaling)
        mask = additive(self.attention_mask(position_ids), x.dtype)
        for layer in self.layers.values():
            x = layer(x, cos, sin, mask)
        if self.lm_head is None:
            return x, position_ids
        return self.lm_head(self.norm(x))

    def _token_positions(self, local_length: int, device: torch.device) -> torch.Tensor:
        """Global indices of the tokens this chunk sees (all of them without context parallelism)."""
        cp = self.context_parallel
        if cp is None:
            return torch.arange(local_length, device=device)
        return cp.local_positions(local_length * cp.size, device)

    def attention_mask(self, position_ids: torch.Tensor):
        """The mask shared by this chunk's layers (``runtime.models.document_attention``): None for causal
        attention over whole sequences; with context parallelism, this rank's queries against the gathered
        keys by global positions, the document ids taken from the gathered position ids of the sequence."""
        document = self.args.attention == "document"
        cp = self.context_parallel
        if cp is None:
            return document_mask(position_ids, self.args.head_size) if document else None
        device = position_ids.device
        length = position_ids.shape[1] * cp.size
        q_pos, kv_pos = cp.local_positions(length, device), cp.gathered_positions(length, device)
        q_doc = kv_doc = None
        if document:
            full = torch.empty(position_ids.shape[0], length, dtype=position_ids.dtype, device=device)
            full[:, kv_pos] = cp.gather(position_ids)  # the sequence's position ids, in order
            doc = document_ids(full)
            q_doc, kv_doc = doc[:, q_pos], doc[:, kv_pos]
        return sequence_mask(q_pos, kv_pos, q_doc, kv_doc, use_flex(device, self.args.head_size))
