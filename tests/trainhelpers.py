"""Helpers for trainer tests: small configs over the fixture shards, torchrun launches, metrics."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import CONFIGS, ROOT

BASE = yaml.safe_load((CONFIGS / "two-stage.yaml").read_text())


def small_config(folder: Path, run_dir: Path, dp: int = 2, accum: int = 1, steps: int = 12, boundary: int = 8,
                 interval: int = 3, name: str = "cfg.yaml", single_stage: bool = False, positions: bool = True,
                 **overrides) -> Path:
    """Two stages (web+code at seq 32, then sft at seq 16), a tiny model, checkpoints every 3 steps."""
    d = copy.deepcopy(BASE)
    d["general"]["run_dir"] = str(run_dir)
    d["parallelism"].update(dp=dp)
    d["model"].update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=1536, max_position_embeddings=64)
    d["tokens"].update(sequence_length=32, micro_batch_size=2, batch_accumulation_per_replica=accum, train_steps=steps)
    d["lr_scheduler"].update(warmup_steps=2)
    d["checkpoints"].update(checkpoint_interval=interval)
    d["logging"] = {"tensorboard": False}
    d["data_stages"][0]["data"].update(num_loading_workers=0, use_position_ids=positions)
    d["data_stages"][1].update(start_training_step=boundary, sequence_length=16)
    if single_stage:
        del d["data_stages"][1]
    for section, values in overrides.items():
        d[section].update(values)
    path = folder / name
    path.write_text(yaml.safe_dump(d))
    return path


def torchrun(config: Path, nproc: int, cwd: Path, env: dict | None = None, script: Path | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script or ROOT / "runtime" / "train.py"), "--config", str(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_one(config: Path, cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m runtime.train`` as one process (no torchrun: a world of one)."""
    proc = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(config)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def worker_stderr(stderr: str) -> str:
    """The workers' part of torchrun's stderr: what precedes torchrun's own failure report (which
    always holds the launcher's traceback, ``ChildFailedError``)."""
    lines = stderr.splitlines()
    cut = next((i for i, line in enumerate(lines) if "torch/distributed/elastic" in line), len(lines))
    return "\n".join(lines[:cut])
