"""A checkpoint of any layout → a Hugging Face ``LlamaForCausalLM`` folder, on one CPU process.

The DCP files are keyed by layout-independent parameter names, so one process reads them without
a process group, a safetensors file's worth at a time (never more than one output shard in
memory). ``config.json`` is written from the checkpoint's own model section, the BOS/EOS ids and
tokenizer files from the data's manifest record; the folder appears atomically (temp + rename).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

import torch

from nanoset import TokenizerInfo
from nanoset.atomic import atomic_write_text, fresh_folder_beside
from nanoset.errors import CheckpointError, ConfigError, OutputExists
from runtime.checkpoint.layout import METADATA, find_checkpoint, read_metadata
from runtime.checkpoint.store import load_dcp, stored_tensors
from runtime.config.load import from_dict
from runtime.config.schema import SIZE_KEYS, ModelArgs
from runtime.hf.config_map import hf_config_json
from runtime.hf.load import INDEX, SINGLE, expected_parameters, hf_name

MAX_SHARD_BYTES = 5 * 10**9  # as save_pretrained: one file up to 5 GB, else shards with an index
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _model_args(metadata: dict, where: Path) -> ModelArgs:
    model = dict(metadata["config"]["model"])
    missing = [k for k in SIZE_KEYS if model.get(k) is None]
    if missing:
        raise ConfigError(f"{where / METADATA}: config.model records no {', '.join(missing)}; is it a "
                          f"checkpoint of this runtime?")
    known = {f.name for f in fields(ModelArgs)}
    return from_dict(ModelArgs, {k: v for k, v in model.items() if k in known}, f"{where}: config.model")


def _tokenizer_info(metadata: dict, where: Path) -> TokenizerInfo | None:
    """The data's tokenizer record (keys of another version ignored); None when the run recorded none."""
    record = metadata.get("tokenizer")
    if not record:
        return None
    if not isinstance(record, dict):
        raise ConfigError(f"{where / METADATA}: tokenizer is {record!r}, not a tokenizer record")
    known = {f.name for f in fields(TokenizerInfo)}
    try:
        return TokenizerInfo(**{k: v for k, v in record.items() if k in known})
    except TypeError as e:  # a required field missing
        raise ConfigError(f"{where / METADATA}: tokenizer record unreadable ({e})") from None


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


def _read_group(checkpoint: Path, group: list[tuple[str, tuple]], stored: dict, dtype: torch.dtype | None
                ) -> dict[str, torch.Tensor]:
    state = {}
    for name, shape in group:
        meta = stored.get(f"model.{name}")
        if meta is None or not hasattr(meta, "size"):
            raise CheckpointError(f"{checkpoint}: holds no model tensor {name}; is it a complete checkpoint?")
        if tuple(meta.size) != shape:
            raise CheckpointError(f"{checkpoint}: tensor {name} has shape {list(meta.size)}, but its model section "
                              f"needs {list(shape)}")
        state[name] = torch.empty(shape, dtype=meta.properties.dtype)
    load_dcp({"model": state}, checkpoint, "choose another checkpoint", no_dist=True)
    return {hf_name(n): (t if dtype is None else t.to(dtype)).contiguous() for n, t in state.items()}


def _write_weights(checkpoint: Path, tmp: Path, args: ModelArgs, dtype: torch.dtype | None, limit: int) -> str:
    from safetensors.torch import save_file

    stored = stored_tensors(checkpoint)
    names = expected_parameters(args)  # a tied lm_head is the embedding: named once, as transformers saves it
    first = stored.get(f"model.{names[0][0]}")
    itemsize = torch.empty((), dtype=dtype or getattr(getattr(first, "properties", None), "dtype", torch.float32)
                           ).element_size()
    groups = _shards(names, itemsize, limit)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file = SINGLE if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = _read_group(checkpoint, group, stored, dtype)
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


def _copy_tokenizer(info: TokenizerInfo | None, tmp: Path) -> str:
    """The data's tokenizer files beside the weights; says what was done (for the log)."""
    if info is None or not info.path:
        return "no tokenizer recorded for the data: tokenizer files not written"
    src = Path(info.path)
    if not src.is_file():
        where = (f"recorded relative to the directory the data was tokenized in, and not found from {Path.cwd()}"
                 if not src.is_absolute() else "no longer there")
        return (f"the data's tokenizer {src} is {where}: tokenizer files not written; copy its tokenizer.json (and "
                f"tokenizer_config.json) into the output folder")
    if not info.matches_file(src):
        return f"{src} changed since the data was made (sha256): tokenizer files not written"
    shutil.copyfile(src, tmp / "tokenizer.json")
    for name in TOKENIZER_SIDE_FILES:
        if (src.parent / name).is_file():
            shutil.copyfile(src.parent / name, tmp / name)
    if not (tmp / "tokenizer_config.json").is_file():  # transformers needs one to load tokenizer.json
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": info.eos_token}
        atomic_write_text(tmp / "tokenizer_config.json", json.dumps(cfg, indent=2) + "\n")
    return f"tokenizer files from {src.parent}"


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str | None = None, replace: bool = False,
                      max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Write ``out`` (a Hugging Face folder) from ``checkpoint`` (a step-N folder, or a checkpoints folder:
    its ``latest``). ``dtype``: ``float32`` or ``bfloat16``, default the checkpoint's. Returns ``out``."""
    checkpoint, out = find_checkpoint(checkpoint), Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {list(DTYPES)}")
    if out.exists() and not replace:
        raise OutputExists(f"{out}: exists; remove it or choose another output folder")
    metadata = read_metadata(checkpoint, record=False)
    if checkpoint.resolve() in out.resolve().parents:
        raise ConfigError(f"{out}: inside the checkpoint {checkpoint} (deleted with it when the run prunes old "
                          f"checkpoints); choose an output folder outside it")
    args = _model_args(metadata, checkpoint)
    info = _tokenizer_info(metadata, checkpoint)
    tmp = fresh_folder_beside(out, f".tmp-{out.name}-{os.getpid()}")
    try:
        written = _write_weights(checkpoint, tmp, args, DTYPES.get(dtype), max_shard_bytes)
        bos, eos = (info.bos_id, info.eos_id) if info is not None else (None, None)
        atomic_write_text(tmp / "config.json", json.dumps(hf_config_json(args, bos, eos, written), indent=2) + "\n")
        generation = {"bos_token_id": bos, "eos_token_id": eos}
        atomic_write_text(tmp / "generation_config.json", json.dumps(generation, indent=2) + "\n")
        note = _copy_tokenizer(info, tmp)
        atomic_write_text(tmp / "nanoset_export.json", json.dumps(
            {"checkpoint": str(checkpoint.resolve()), "step": metadata.get("training", {}).get("last_train_step"),
             "tokenizer": note}, indent=1) + "\n")
        old = out.with_name(f".old-{out.name}-{os.getpid()}") if out.exists() else None
        if old is not None:
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
