"""Generate ``data_fixtures/checkpoint-v1/``: a real checkpoint in the version-1 format, kept so that every later
version of the runtime is tested to resume it, export it and explain it.

    python tools/make_checkpoint_fixture.py   # rewrites data_fixtures/checkpoint-v1 (run it on code that writes v1)

The fixture corpora (web, code, sft) are tokenized into ``DATA_ROOT/shards`` (with a copy of the fixture
tokenizer in ``DATA_ROOT/tokenizer``); a two-stage run of a tiny tied model
(blend of web and code at sequence length 32, then sft at 16 from step 5) trains 6 steps on one CPU process,
checkpointing every 3. The folder keeps its ``config.yaml``, the checkpoint of step 3 (model, AdamW state, RNG,
``metadata.json``: under 400 kB) and ``fixture.json``: where the data was (the record holds resolved dataset
folders: a test moves them to its own copy of the data), the torch version, and the losses of all 6 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset.tokenize.job import TokenizeOptions, tokenize  # noqa: E402

OUT = ROOT / "data_fixtures" / "checkpoint-v1"
DATA_ROOT = Path("/tmp/nanoset-checkpoint-fixture")  # recorded in the checkpoint: a fixed, documented place
KEPT = "step-000003"
CONFIG = {
    "general": {"project": "fixture", "run": "checkpoint-v1", "seed": 42, "run_dir": "run"},
    "parallelism": {"dp": 1, "tp": 1, "pp": 1, "pp_engine": "1f1b"},
    "model": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "intermediate_size": 32, "vocab_size": 1536, "max_position_embeddings": 64,
              "tie_word_embeddings": True},
    "tokens": {"sequence_length": 32, "micro_batch_size": 2, "batch_accumulation_per_replica": 2, "train_steps": 6},
    "optimizer": {"learning_rate": 3.0e-3, "weight_decay": 0.1, "clip_grad": 1.0},
    "lr_scheduler": {"warmup_steps": 2, "decay_style": "cosine", "min_lr": 3.0e-4},
    "checkpoints": {"checkpoint_interval": 3, "resume": "latest", "keep_last": 3},
    "logging": {"tensorboard": False},
    "data_stages": [
        {"name": "pretrain", "start_training_step": 1,
         "data": {"seed": 42, "num_loading_workers": 0, "use_position_ids": True,
                  "dataset": {"dataset_folder": ["shards/web", "shards/code"], "dataset_weights": [0.7, 0.3]}}},
        {"name": "anneal", "start_training_step": 5, "sequence_length": 16,
         "data": {"num_loading_workers": 0, "dataset": {"dataset_folder": "shards/sft"}}},
    ],
}


def make_data(root: Path) -> None:
    """The shards, tokenized with a copy of the fixture tokenizer under ``root`` (the path the record keeps)."""
    shutil.copytree(ROOT / "data_fixtures" / "tokenizer", root / "tokenizer")
    for name in ("web", "code", "sft"):
        tokenize(TokenizeOptions(inputs=[str(ROOT / "data_fixtures" / "corpus" / name)], output=root / "shards" / name,
                                 tokenizer=str(root / "tokenizer"), task_bytes=100_000, progress=False))


def main() -> int:
    shutil.rmtree(DATA_ROOT, ignore_errors=True)
    DATA_ROOT.mkdir(parents=True)
    make_data(DATA_ROOT)
    (DATA_ROOT / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "runtime.train", "--config", "config.yaml"], cwd=DATA_ROOT, env=env,
                   check=True)
    rows = [json.loads(line) for line in (DATA_ROOT / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r and "step" in r]
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    shutil.copytree(DATA_ROOT / "run" / "checkpoints" / KEPT, OUT / KEPT)
    shutil.copyfile(DATA_ROOT / "config.yaml", OUT / "config.yaml")
    (OUT / "fixture.json").write_text(json.dumps(
        {"data_root": str(DATA_ROOT), "torch": torch.__version__, "checkpoint": KEPT, "losses": losses}, indent=1)
        + "\n")
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({size / 1000:.0f} kB); losses {losses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
