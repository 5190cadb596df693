"""The Llama model: the shared decoder, its plan and its initialisation, unchanged."""

from __future__ import annotations

from runtime.models.decoder import DecoderChunk
from runtime.models.init import init_weights
from runtime.models.spec import FamilyModules
from runtime.models.tensor_parallel import decoder_plan


class LlamaChunk(DecoderChunk):
    """A pipeline chunk of a Llama decoder."""


MODULES = FamilyModules(chunk=LlamaChunk, init_weights=init_weights, tensor_parallel_plan=decoder_plan)
