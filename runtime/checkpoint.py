"""Checkpoints through ``torch.distributed.checkpoint``: sharded, reshardable, atomic.

A checkpoint is a folder ``step-000040`` with the DCP files (model and AdamW state keyed by the
layout-independent parameter names, so any tp/pp/dp layout can load it), one RNG file per rank,
and ``metadata.json`` (training progress, data fingerprint, config). It is written under a
temporary name and renamed when complete; ``latest`` is updated last. A crash at any moment
leaves the previous checkpoint and ``latest`` intact; stale temporary folders are removed on start.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nanoset.atomic import atomic_write_text
from runtime.checkpoint_read import earlier_checkpoints_hint, load_dcp
from nanoset.errors import ConfigError
from runtime.engine import Engine
from runtime.run_start import LATEST, checkpoint_step, resolve_checkpoint

FAULT_ENV = "NANOSET_FAULT_KILL_IN_CHECKPOINT"  # fault injection for tests: SIGKILL before the rename


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _optimizer_state(engine: Engine) -> dict[str, torch.Tensor]:
    """AdamW state keyed by parameter name; creates empty state (to be loaded into) when missing."""
    out = {}
    fused = engine.device.type == "cuda"
    for name, p in engine.named_parameters():
        st = engine.optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            out[f"{name}.{key}"] = st[key]
    return out


def model_state(engine: Engine) -> dict[str, torch.Tensor]:
    """The weights by layout-independent name, each tensor once: a tied head is the embedding, so only
    ``embed_tokens.weight`` is saved and loaded (``state_dict`` would also list it as ``lm_head.weight``),
    whatever the layout. With pp > 1 the last stage's head copy is stored under that name too (equal
    shards, which DCP writes once)."""
    model = {}
    for chunk in engine.chunks:
        aliases = ({n for n, _ in chunk.named_parameters(remove_duplicate=False)}
                   - {n for n, _ in chunk.named_parameters()})
        model.update({chunk.stored_name(k): v for k, v in chunk.state_dict().items() if k not in aliases})
    return model


def _app_state(engine: Engine) -> dict:
    return {"model": model_state(engine), "optimizer": _optimizer_state(engine)}


def _rng_state() -> dict:
    """Every generator's state as tensors, lists and numbers only, so it loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                       gauss], "python": [version, list(mt), gauss_next]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, mt, gauss_next = state["python"]
    random.setstate((version, tuple(mt), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointManager:
    def __init__(self, folder: Path, keep_last: int, is_writer: bool) -> None:
        self.folder = Path(folder)
        self.keep_last = keep_last
        self.is_writer = is_writer  # global rank 0 renames, updates `latest` and prunes

    def clean_stale(self) -> None:
        """Remove temporary folders of saves that a crash interrupted."""
        if self.is_writer and self.folder.is_dir():
            for p in self.folder.glob(".tmp-*"):
                shutil.rmtree(p, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()

    def save(self, engine: Engine, step: int, metadata: dict) -> Path:
        final = self.folder / checkpoint_name(step)
        tmp = self.folder / f".tmp-{checkpoint_name(step)}"
        if self.is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        dcp.save(_app_state(engine), checkpoint_id=str(tmp))
        torch.save(_rng_state(), tmp / f"rng-rank{dist.get_rank()}.pt")
        if self.is_writer:
            atomic_write_text(tmp / "metadata.json", json.dumps(dict(metadata, world_size=dist.get_world_size()),
                                                                indent=1))
        dist.barrier()
        if self.is_writer:
            if os.environ.get(FAULT_ENV) == str(step):
                os.kill(os.getpid(), signal.SIGKILL)
            if final.exists():  # a rerun of the same step after a crash: replace it
                self._discard(final)
            os.replace(tmp, final)
            _fsync_dir(self.folder)
            atomic_write_text(self.folder / LATEST, final.name + "\n")
            self._prune(keep=final.name)
        dist.barrier()
        return final

    def _prune(self, keep: str) -> None:
        """Keep the ``keep_last`` newest by step number (not by name: step-1000000 > step-998000),
        and never ``keep`` (just written) or the checkpoint ``latest`` names."""
        pointer = self.folder / LATEST
        protected = {keep, pointer.read_text().strip() if pointer.is_file() else keep}
        done = sorted((step, p) for p in self.folder.iterdir()
                      if p.is_dir() and (step := checkpoint_step(p.name)) is not None)
        for _, old in done[: -self.keep_last]:
            if old.name not in protected:
                self._discard(old)

    def _discard(self, checkpoint: Path) -> None:
        """Delete a checkpoint folder; renamed first, so a kill midway never leaves a ``step-N`` folder
        whose ``metadata.json`` outlived its shards (the remains are stale: removed on the next start)."""
        doomed = self.folder / f".tmp-discard-{checkpoint.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(checkpoint, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def resolve(self, resume: str | None) -> Path | None:
        """The checkpoint to load: ``latest`` (None when there is none yet), a path, or None."""
        return resolve_checkpoint(self.folder, resume)

    def load(self, engine: Engine, path: Path) -> dict:
        """Load model and optimizer (resharding to this layout), RNG states; return the metadata."""
        metadata = json.loads((path / "metadata.json").read_text())
        hint = earlier_checkpoints_hint(path)
        load_dcp(_app_state(engine), path, hint)  # in place: parameters, AdamW state
        rng = path / f"rng-rank{dist.get_rank()}.pt"
        if metadata.get("world_size") == dist.get_world_size():  # the same layout: each rank its own RNG file
            state, error = None, ""
            try:
                state = torch.load(rng, weights_only=True) if rng.is_file() else None
            except Exception as e:  # noqa: BLE001 - a torn file: zip, pickle or EOF errors alike
                error = f"{rng.name} ({e})"
            # every rank learns that a file failed, so all stop with the same line (none waits alone)
            errors = [""] * dist.get_world_size()
            dist.all_gather_object(errors, error)
            if any(errors):
                raise ConfigError(f"{path}: unreadable RNG file {next(e for e in errors if e)}; {hint}")
            if state is not None:
                _set_rng_state(state)
        return metadata


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
