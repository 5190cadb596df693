"""The Qwen2 model: the shared decoder whose q, k and v projections have biases.

Under tensor parallelism a bias is split as its projection's output rows (the shared plan's column split), so
each rank holds the biases of its own heads; the seeded initialisation starts them at 0, as transformers does.
"""

from __future__ import annotations

from runtime.models.decoder import Attention, DecoderChunk
from runtime.models.init import init_weights
from runtime.models.spec import FamilyModules
from runtime.models.tensor_parallel import decoder_plan


class Qwen2Attention(Attention):
    qkv_bias = True


class Qwen2Chunk(DecoderChunk):
    """A pipeline chunk of a Qwen2 decoder."""

    attention = Qwen2Attention


MODULES = FamilyModules(chunk=Qwen2Chunk, init_weights=init_weights, tensor_parallel_plan=decoder_plan)
