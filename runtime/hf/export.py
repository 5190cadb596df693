"""A checkpoint of any layout → a Hugging Face folder of its model family (``LlamaForCausalLM``, …), on one CPU
process.

The DCP files are keyed by layout-independent parameter names, so one process reads them without
a process group, a safetensors file's worth at a time (never more than one output shard in
memory). ``config.json`` is written from the checkpoint's own model section, the BOS/EOS ids and
tokenizer files from its record of the data's tokenizer (that of the checkpoint's stage, with the chat
template of its conversations: ``tokenizer_files``); the folder appears atomically (temp + rename).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import torch

from nanoset.atomic import atomic_write_text, fresh_folder_beside
from nanoset.errors import CheckpointError, ConfigError, OutputExists
from runtime.checkpoint.layout import CHECKPOINT_ARGUMENT, METADATA, earlier_checkpoints_hint, find_checkpoint
from runtime.checkpoint.record import CheckpointRecord, read_metadata
from runtime.checkpoint.store import load_dcp, stored_tensors
from runtime.config.load import from_dict
from runtime.config.schema import SIZE_KEYS, ModelArgs
from runtime.hf.load import INDEX, SINGLE, expected_parameters, hf_name
from runtime.hf.tokenizer_files import check_tokenizer_folder, copy_tokenizer_folder, write_data_tokenizer
from runtime.models.registry import spec_of

MAX_SHARD_BYTES = 5 * 10**9  # as save_pretrained: one file up to 5 GB, else shards with an index
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _model_args(record: CheckpointRecord, where: Path) -> ModelArgs:
    model = dict(record.model)
    missing = [k for k in SIZE_KEYS if model.get(k) is None]
    if missing:
        raise ConfigError(f"{where / METADATA}: config.model records no {', '.join(missing)}; is it a "
                          f"checkpoint of this runtime?")
    known = {f.name for f in fields(ModelArgs)}
    return from_dict(ModelArgs, {k: v for k, v in model.items() if k in known}, f"{where}: config.model")


def _shards(names: list[tuple[str, tuple[int, ...]]], itemsize: int, limit: int) -> list[list[tuple[str, tuple]]]:
    """Parameters in order, cut into groups of at most ``limit`` bytes (a larger tensor alone)."""
    groups: list[list] = [[]]
    size = 0
    for name, shape in names:
        n = itemsize * int(torch.Size(shape).numel())
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += n
    return groups


def _read_group(checkpoint: Path, group: list[tuple[str, tuple]], stored: dict, dtype: torch.dtype | None,
                what_to_do: str, family: str) -> dict[str, torch.Tensor]:
    state = {}
    for name, shape in group:
        meta = stored.get(f"model.{name}")
        if meta is None or not hasattr(meta, "size"):
            raise CheckpointError(f"{checkpoint}: holds no model tensor {name}; is it a complete checkpoint?")
        if tuple(meta.size) != shape:
            raise CheckpointError(f"{checkpoint}: tensor {name} has shape {list(meta.size)}, but its model section "
                              f"needs {list(shape)}")
        state[name] = torch.empty(shape, dtype=meta.properties.dtype)
    load_dcp({"model": state}, checkpoint, what_to_do, no_dist=True)
    return {hf_name(n, family): (t if dtype is None else t.to(dtype)).contiguous() for n, t in state.items()}


def _write_weights(checkpoint: Path, tmp: Path, args: ModelArgs, dtype: torch.dtype | None, limit: int,
                   what_to_do: str) -> str:
    from safetensors.torch import save_file

    stored = stored_tensors(checkpoint, what_to_do)
    names = expected_parameters(args)  # a tied lm_head is the embedding: named once, as transformers saves it
    first = stored.get(f"model.{names[0][0]}")
    itemsize = torch.empty((), dtype=dtype or getattr(getattr(first, "properties", None), "dtype", torch.float32)
                           ).element_size()
    groups = _shards(names, itemsize, limit)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file = SINGLE if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = _read_group(checkpoint, group, stored, dtype, what_to_do, args.family)
        save_file(tensors, str(tmp / file), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
        out_dtype = next(iter(tensors.values())).dtype
        del tensors
    if len(groups) > 1:
        atomic_write_text(tmp / INDEX, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                  indent=2) + "\n")
    return str(out_dtype).removeprefix("torch.")


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str | None = None, replace: bool = False,
                      max_shard_bytes: int = MAX_SHARD_BYTES, tokenizer: str | Path | None = None) -> Path:
    """Write ``out`` (a Hugging Face folder) from ``checkpoint`` (a step-N folder, or a checkpoints folder:
    its ``latest``). ``dtype``: ``float32`` or ``bfloat16``, default the checkpoint's; ``tokenizer``: a tokenizer
    folder whose files the export carries instead of those of the data the checkpoint's stage trained on (with
    its chat template and special tokens). Returns ``out``."""
    checkpoint, out = find_checkpoint(checkpoint), Path(out)
    if tokenizer is not None:
        check_tokenizer_folder(tokenizer)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {list(DTYPES)}")
    if out.exists() and not replace:
        raise OutputExists(f"{out}: exists; remove it or choose another output folder")
    record = read_metadata(checkpoint)
    if checkpoint.resolve() in out.resolve().parents:
        raise ConfigError(f"{out}: inside the checkpoint {checkpoint} (deleted with it when the run prunes old "
                          f"checkpoints); choose an output folder outside it")
    args = _model_args(record, checkpoint)
    info = record.tokenizer.info if record.tokenizer is not None else None
    what_to_do = earlier_checkpoints_hint(checkpoint, CHECKPOINT_ARGUMENT)
    tmp = fresh_folder_beside(out, f".tmp-{out.name}-{os.getpid()}")
    try:
        written = _write_weights(checkpoint, tmp, args, DTYPES.get(dtype), max_shard_bytes, what_to_do)
        bos, eos = (info.bos_id, info.eos_id) if info is not None else (None, None)
        atomic_write_text(tmp / "config.json", json.dumps(hf_config_json(args, bos, eos, written), indent=2) + "\n")
        generation = {"bos_token_id": bos, "eos_token_id": eos}
        atomic_write_text(tmp / "generation_config.json", json.dumps(generation, indent=2) + "\n")
        note = copy_tokenizer_folder(Path(tokenizer), tmp) if tokenizer is not None else \
            write_data_tokenizer(record.tokenizer, tmp, args.max_position_embeddings)
        atomic_write_text(tmp / "nanoset_export.json", json.dumps(
            {"checkpoint": str(checkpoint.resolve()), "step": record.last_step, "tokenizer": note}, indent=1) + "\n")
        old = out.with_name(f".old-{out.name}-{os.getpid()}") if out.exists() else None
        if old is not None:
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def hf_config_json(model: ModelArgs, bos_id: int | None, eos_id: int | None, dtype: str) -> dict:
    """A complete config.json of ``model``'s family (its first architecture, ``LlamaForCausalLM`` for Llama) for
    ``model`` (both rope forms, so transformers 4 and 5 read it). Every field is written here: a config that
    transformers fills with its own defaults would silently change the model."""
    spec = spec_of(model)
    rope = {"rope_type": "default"} if model.rope_scaling is None else {
        k: v for k, v in asdict(model.rope_scaling).items() if v is not None}
    return {
        "architectures": [spec.hf_architectures[0]],
        **spec.hf_fields(model),
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.kv_heads,
        "head_dim": model.head_size,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_position_embeddings,
        "rms_norm_eps": model.rms_norm_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": None if model.rope_scaling is None else rope,
        "rope_parameters": dict(rope, rope_theta=model.rope_theta),
        "tie_word_embeddings": model.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": model.init_std,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
