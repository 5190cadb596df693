"""The parallelize recipe of one model chunk, in torchtitan's order: tensor parallel, activation
checkpointing, compile, then FSDP2. Each step changes the chunk in place and keeps parameter names
(so checkpoints and Hugging Face export are the same whatever the setting).

* **Tensor parallelism** with DTensor, by the plan of the model's family (its ``ModelSpec``: Megatron-style
  column/row splits of attention and MLP, a vocabulary-parallel embedding, a vocabulary-sharded head whose loss
  is computed without gathering the logits). A tied head is the embedding: both are split over the
  vocabulary (rows of the ``[vocab, hidden]`` weight), so one sharded parameter serves both.
* **Activation checkpointing** (``model.activation_checkpointing``): a checkpointed layer keeps only
  its input from the forward pass and runs its forward again during the backward pass, activation
  memory of ``O(layers)`` inputs for about one more forward. ``full`` checkpoints every layer,
  ``selective`` every ``activation_checkpointing_every``-th one (global layer indices 0, N, 2N, …, so
  the choice does not depend on how the pipeline cuts the model). The layer's ``forward`` is wrapped
  in place rather than the module in a ``CheckpointWrapper``.
* **Compile** (``model.compile``): each decoder layer, not the whole chunk. All layers share one
  compiled graph (their code is the same and parameters are graph inputs), so compilation costs one
  layer whatever the depth; a pipeline cut, FSDP's hooks (outside the graph, around each layer's
  call) and the loss (computed by the engine, eagerly) are untouched. A new sequence length (a stage
  switch) compiles once more.
* **Context parallelism** (``parallelism.cp``): the chunk and its attention layers learn their cp group,
  so that attention gathers keys and values over it (``runtime/parallel/context_parallel.py``); no
  parameter changes.
* **FSDP2** (``fully_shard``) over the dp×cp ranks (the flattened ``dp_cp`` mesh: cp ranks hold the
  same parameters as the replicas do): parameters, gradients and optimizer state sharded;
  bf16 compute with fp32 gradient reduction on CUDA. Applied last, so its hooks gather the parameters
  around the whole checkpointed layer, recomputation included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.checkpoint import checkpoint

from runtime.config import ModelArgs
from runtime.parallel.context_parallel import ContextParallel


def parallelize(chunk: nn.Module, args: ModelArgs, tp_plan: Callable[[nn.Module], dict], tp_mesh: DeviceMesh,
                dp_mesh: DeviceMesh | None, param_dtype: torch.dtype,
                context_parallel: ContextParallel | None = None) -> None:
    """Apply the recipe to ``chunk`` (a decoder chunk of the family whose tensor-parallel plan is ``tp_plan``,
    still on the meta device); ``dp_mesh`` (the ranks sharing parameters: dp × cp) None: no FSDP;
    ``context_parallel`` None: whole sequences."""
    apply_tensor_parallel(chunk, tp_mesh, tp_plan)
    apply_context_parallel(chunk, context_parallel)
    apply_activation_checkpointing(chunk, args.num_hidden_layers, args.activation_checkpointing,
                                   args.activation_checkpointing_every)
    if args.compile:
        compile_layers(chunk)
    if dp_mesh is not None:
        apply_fsdp(chunk, dp_mesh, param_dtype)


def apply_tensor_parallel(chunk: nn.Module, tp_mesh: DeviceMesh, tp_plan: Callable[[nn.Module], dict]) -> None:
    """Shard ``chunk`` over ``tp_mesh`` in place, by ``tp_plan(chunk)`` (module name → torch parallel style)."""
    if tp_mesh.size() == 1:
        return
    plan = tp_plan(chunk)
    tied = chunk.has_embedding and chunk.has_head and chunk.lm_head.weight is chunk.embed_tokens.weight
    parallelize_module(chunk, tp_mesh, plan)
    if tied:
        # parallelize_module gives each module its own DTensor copy; share the embedding's again
        # (before FSDP, as with tp = 1) so both uses' gradients add into one parameter
        chunk.lm_head.weight = chunk.embed_tokens.weight


def apply_context_parallel(chunk: nn.Module, context_parallel: ContextParallel | None) -> None:
    """Give ``chunk`` and its attention layers their cp group (None: whole sequences)."""
    chunk.context_parallel = context_parallel
    for layer in chunk.layers.values():
        layer.attn.context_parallel = context_parallel


def checkpointed_layers(num_layers: int, mode: str, every: int) -> set[int]:
    """Global indices of the layers that ``mode`` checkpoints."""
    if mode == "none":
        return set()
    if mode == "full":
        return set(range(num_layers))
    if mode == "selective":
        return set(range(0, num_layers, every))
    raise ValueError(f"model.activation_checkpointing: {mode!r} is not one of none, full, selective")


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # non-reentrant: works with torch.compile and with inputs that need no gradient
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(chunk: nn.Module, num_layers: int, mode: str, every: int) -> list[int]:
    """Checkpoint the chosen layers of ``chunk``; returns their global indices."""
    chosen = checkpointed_layers(num_layers, mode, every)
    done = []
    for name, layer in chunk.layers.items():
        if int(name) in chosen:
            layer.forward = functools.partial(_checkpointed, layer.forward)
            done.append(int(name))
    return done


def compile_layers(chunk: nn.Module) -> None:
    """Replace each decoder layer's ``forward`` by its compiled version (after activation checkpointing)."""
    for layer in chunk.layers.values():
        layer.forward = torch.compile(layer.forward, dynamic=False)


def compile_variants(sequence_lengths: set[int], checkpointing: bool) -> int:
    """The graphs a compiled layer may need in one run: per sequence length (a stage's), training and
    validation (grad mode), and with activation checkpointing its recomputation too."""
    return len(sequence_lengths) * 2 * (2 if checkpointing else 1)


def set_recompile_limit(variants: int) -> int:
    """Let dynamo keep ``variants`` graphs per compiled function (its default is 8) and fail loudly past the limit:
    by default it falls back to eager code there, which for flex_attention is a full score matrix per layer
    (minutes per step, or out of memory, without a word). Returns the limit set."""
    import torch._dynamo.config as dynamo

    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    limit = max(getattr(dynamo, name), variants)
    setattr(dynamo, name, limit)
    for fail in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(dynamo, fail):
            setattr(dynamo, fail, True)
            break
    return limit


def reshards_after_forward(layer_index: int, num_layers: int, mesh_size: int) -> bool:
    """FSDP's ``reshard_after_forward`` of a decoder layer: not for the last one (its parameters are needed again
    right away by the root's backward), and not over a one-rank group (FSDP there only casts to bf16: resharding
    frees nothing and costs a copy per layer)."""
    return mesh_size > 1 and layer_index < num_layers - 1


def apply_fsdp(chunk: nn.Module, dp_mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    """Shard each decoder layer, then the chunk (embedding, norm, head) as the root group."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 kept it under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = list(chunk.layers.values())
    for i, layer in enumerate(layers):
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp,
                    reshard_after_forward=reshards_after_forward(i, len(layers), dp_mesh.size()))
    fully_shard(chunk, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=dp_mesh.size() > 1)
