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

from nanoset.format import atomic_write_text
from runtime.engine import Engine

LATEST = "latest"
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


def _app_state(engine: Engine) -> dict:
    model = {}
    for chunk in engine.chunks:
        model.update(chunk.state_dict())
    return {"model": model, "optimizer": _optimizer_state(engine)}


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
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
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.folder)
            atomic_write_text(self.folder / LATEST, final.name + "\n")
            self._prune()
        dist.barrier()
        return final

    def _prune(self) -> None:
        done = sorted(p for p in self.folder.glob("step-*") if p.is_dir())
        for old in done[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def resolve(self, resume: str | None) -> Path | None:
        """The checkpoint to load: ``latest`` (None when there is none yet), a path, or None."""
        if resume is None:
            return None
        if resume == LATEST:
            pointer = self.folder / LATEST
            if not pointer.is_file():
                return None
            path = self.folder / pointer.read_text().strip()
        else:
            path = Path(resume)
        if not (path / "metadata.json").is_file():
            raise FileNotFoundError(f"checkpoint {path}: no metadata.json; it is not a complete checkpoint "
                                    f"(checkpoints.resume: latest | PATH | null)")
        return path

    def load(self, engine: Engine, path: Path) -> dict:
        """Load model and optimizer (resharding to this layout), RNG states; return the metadata."""
        metadata = json.loads((path / "metadata.json").read_text())
        state = _app_state(engine)
        dcp.load(state, checkpoint_id=str(path))  # in place: into the parameters and AdamW state
        rng = path / f"rng-rank{dist.get_rank()}.pt"
        if metadata.get("world_size") == dist.get_world_size() and rng.is_file():
            _set_rng_state(torch.load(rng, weights_only=False))
        return metadata


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
