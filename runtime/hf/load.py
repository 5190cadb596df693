"""Load a Hugging Face model's safetensors straight into this rank's parameter shards.

Each rank opens the (memory-mapped) safetensors files that hold its chunks' tensors and reads
only its own slice of each: the slice comes from the parameter's DTensor placements (tensor
parallel rows or columns, FSDP2's dim-0 shards, both at once), so no rank ever holds the whole
model, whatever the tp/pp/dp layout. ``check_hf_weights`` reads only the headers, before any
process group, so a missing tensor or a wrong shape is one line instead of a crash on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from nanoset.errors import ConfigError, MissingPath
from runtime.config import ModelArgs
from runtime.models.registry import DEFAULT_FAMILY, model_spec, spec_of
from runtime.parallel.shards import local_slices, local_tensor

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
def hf_name(name: str, family: str = DEFAULT_FAMILY) -> str:
    """Our parameter name → the Hugging Face one, by the family's adapter (``layers.3.attn.q_proj.weight`` →
    ``model.layers.3.self_attn.q_proj.weight``)."""
    return model_spec(family).hf_name(name)


class SafetensorsFolder:
    """The tensors of ``model.safetensors`` or of the files a ``model.safetensors.index.json`` names."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if (self.folder / SINGLE).is_file():
            self.where: dict[str, str] | None = None  # filled from the single file's header on first use
        elif (self.folder / INDEX).is_file():
            try:
                weight_map = json.loads((self.folder / INDEX).read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"model.init_from_hf: {self.folder / INDEX}: not a safetensors index ({e})") from None
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise ConfigError(f"model.init_from_hf: {self.folder / INDEX}: not a safetensors index (weight_map "
                                  f"must map tensor names to file names)")
            self.where = dict(weight_map)
        else:
            raise MissingPath(f"model.init_from_hf: {self.folder}: neither {SINGLE} nor {INDEX}; save the "
                                    f"model with save_pretrained(..., safe_serialization=True)")
        self._open: dict[str, object] = {}

    def _handle(self, file: str):
        if file not in self._open:
            from safetensors import safe_open

            path = self.folder / file
            if not path.is_file():
                raise MissingPath(f"model.init_from_hf: {path}: missing ({INDEX} names it)")
            try:
                self._open[file] = safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own SafetensorError for a bad header or size
                raise ConfigError(f"model.init_from_hf: {path}: not a valid safetensors file ({e}); "
                                  f"download or save it again") from None
        return self._open[file]

    def file_of(self, name: str) -> str | None:
        if self.where is None:
            self.where = {k: SINGLE for k in self._handle(SINGLE).keys()}
        return self.where.get(name)

    def slice(self, name: str):
        """The lazily read tensor ``name`` (index it to read a part); None when the checkpoint lacks it."""
        file = self.file_of(name)
        if file is None:
            return None
        handle = self._handle(file)
        try:
            return handle.get_slice(name)
        except Exception as e:
            raise ConfigError(f"model.init_from_hf: {self.folder / file}: tensor {name} unreadable ({e})") from None

    def path_of(self, name: str) -> Path:
        return self.folder / (self.file_of(name) or SINGLE)


def expected_parameters(args: ModelArgs) -> list[tuple[str, tuple[int, ...]]]:
    """Our parameter names and full shapes for ``args`` (its family's model, built on the meta device: no memory)."""
    with torch.device("meta"):
        chunk = spec_of(args).modules().chunk(args)
    return [(n, tuple(p.shape)) for n, p in chunk.named_parameters()]


def _checked(files: SafetensorsFolder, name: str, shape: tuple[int, ...], family: str):
    hf = hf_name(name, family)
    sl = files.slice(hf)
    if sl is None:
        raise ConfigError(f"model.init_from_hf: {files.folder}: tensor {hf} is missing (needed for our {name}); "
                          f"is it a complete {'tied ' if name == 'lm_head.weight' else ''}checkpoint of this model?")
    found = tuple(sl.get_shape())
    if found != shape:
        raise ConfigError(f"model.init_from_hf: {files.path_of(hf)}: tensor {hf} has shape {list(found)}, but the "
                          f"model (config.json) needs {list(shape)}")
    return sl


def check_hf_weights(args: ModelArgs) -> None:
    """Every tensor the model needs is in ``args.init_from_hf`` with the right shape (headers only; a
    tied model's file that also holds ``lm_head.weight`` has it compared with the embedding)."""
    files = SafetensorsFolder(args.init_from_hf)
    for name, shape in expected_parameters(args):
        _checked(files, name, shape, args.family)
    if args.tie_word_embeddings:
        _check_tied_head(files)


def _check_tied_head(files: SafetensorsFolder, rows: int = 4096) -> None:
    """A tied model's file may also hold ``lm_head.weight``: a copy is fine, but another tensor means the
    model is not tied (transformers then keeps both); using the embedding as the head would be wrong."""
    head = files.slice("lm_head.weight")
    if head is None:
        return
    embed = files.slice("model.embed_tokens.weight")
    shape = tuple(head.get_shape())
    if shape == tuple(embed.get_shape()) and all(torch.equal(head[i:i + rows], embed[i:i + rows])
                                                 for i in range(0, shape[0], rows)):
        return
    raise ConfigError(f"model.init_from_hf: {files.path_of('lm_head.weight')}: lm_head.weight differs from "
                      f"model.embed_tokens.weight, but config.json says tie_word_embeddings: true (transformers "
                      f"would not tie them); set \"tie_word_embeddings\": false in a copy of "
                      f"{files.folder / 'config.json'} to train them untied")


@torch.no_grad()
def load_hf_weights(chunks: list[nn.Module], folder: str | Path) -> int:
    """Copy this rank's slices of the Hugging Face weights in ``folder`` into ``chunks``; returns the
    number of parameters set. A tied weight is read from ``model.embed_tokens`` (once with pp = 1; by
    the first and the last stage with pp > 1)."""
    files = SafetensorsFolder(folder)
    count = 0
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            # a pp-tied head reads the embedding
            sl = _checked(files, chunk.stored_name(name), tuple(p.shape), chunk.args.family)
            local = local_tensor(p)
            index = local_slices(p)
            part = sl[index] if local.ndim else sl[:]
            if tuple(part.shape) != tuple(local.shape):
                raise AssertionError(f"{name}: read {tuple(part.shape)} for a local shard of {tuple(local.shape)}")
            local.copy_(part)
            count += 1
    return count
