"""The one config builder of the tests: a base config (the two-stage fixture config, the engine tests' tiny
model, the Hugging Face tests' skeleton) with sections updated, built and checked as ``load_config`` does.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from runtime.config import Config
from runtime.config.load import config_from_data
from tests.support import CONFIGS

TWO_STAGE = yaml.safe_load((CONFIGS / "two-stage.yaml").read_text())
LONG_CONTEXT = yaml.safe_load((CONFIGS / "long-context.yaml").read_text())
# the engine tests' tiny Llama (GQA, 4 layers) on fixed batches
TINY = {
    "general": {"project": "t", "run": "engine", "seed": 7},
    "model": {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64},
    "tokens": {"sequence_length": 16, "micro_batch_size": 2, "batch_accumulation_per_replica": 4, "train_steps": 3},
    "optimizer": {"learning_rate": 1e-2, "weight_decay": 0.1, "clip_grad": 0.5},
    "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "unused"}}}],
}
# the Hugging Face tests: the model comes from model.init_from_hf
HF_BASE = {
    "general": {"project": "t", "run": "hf", "seed": 3},
    "model": {},
    "tokens": {"sequence_length": 16, "micro_batch_size": 2, "train_steps": 1, "batch_accumulation_per_replica": 2},
    "optimizer": {"learning_rate": 1e-3},
    "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "unused"}}}],
}


def merged(base: dict, **sections) -> dict:
    """A copy of ``base`` with each named section updated (a mapping) or replaced (anything else)."""
    d = copy.deepcopy(base)
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(d.get(section), dict):
            d[section].update(copy.deepcopy(values))
        else:
            d[section] = copy.deepcopy(values)
    return d


def build(data: dict) -> Config:
    return config_from_data(data)


def make_config(dp=1, accum=1, mbs=2, train_steps=40, stages=None, seq=128, pp=1, **top) -> Config:
    d = merged(TWO_STAGE)
    d.update(top)
    d["parallelism"].update(dp=dp, pp=pp, pp_engine="afab")
    d["tokens"].update(micro_batch_size=mbs, batch_accumulation_per_replica=accum, train_steps=train_steps,
                       sequence_length=seq)
    if stages is not None:
        d["data_stages"] = stages
    d["lr_scheduler"]["warmup_steps"] = min(d["lr_scheduler"]["warmup_steps"], train_steps)  # within the run
    return build(d)


def small_config(folder: Path, run_dir: Path, dp: int = 2, accum: int = 1, steps: int = 12, boundary: int = 8,
                 interval: int = 3, name: str = "cfg.yaml", single_stage: bool = False, positions: bool = True,
                 **overrides) -> Path:
    """Two stages (web+code at seq 32, then sft at seq 16), a tiny model, checkpoints every 3 steps."""
    d = merged(TWO_STAGE)
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
    d = merged(d, **overrides)
    path = folder / name
    path.write_text(yaml.safe_dump(d))
    return path


def long_context_config(folder: Path, run_dir: Path, parallelism: dict, accum: int = 2, steps: int = 6,
                        boundary: int = 4, name: str = "cfg.yaml", **overrides) -> Path:
    """The long-context fixture (a blend at seq 32, then at seq 128 from ``boundary``, document attention,
    validation at each stage end) with small_config's tiny model, checkpoints every 3 steps."""
    d = merged(LONG_CONTEXT, parallelism=parallelism)
    d["general"]["run_dir"] = str(run_dir)
    d["model"].update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=1536, max_position_embeddings=128)
    d["tokens"].update(sequence_length=32, micro_batch_size=2, batch_accumulation_per_replica=accum, train_steps=steps)
    d["lr_scheduler"].update(warmup_steps=2)
    d["checkpoints"].update(checkpoint_interval=3)
    d["logging"] = {"tensorboard": False}
    d["validation"].update(samples=4)
    d["data_stages"][1].update(start_training_step=boundary, sequence_length=128)
    d = merged(d, **overrides)
    path = folder / name
    path.write_text(yaml.safe_dump(d))
    return path


def tiny_config(dp=1, tp=1, pp=1, engine="1f1b", accum=4, virtual=2, cp=1, **model) -> Config:
    return build(merged(TINY, parallelism={"dp": dp, "tp": tp, "pp": pp, "cp": cp, "pp_engine": engine,
                                           "pp_virtual_stages": virtual},
                        tokens={"batch_accumulation_per_replica": accum}, model=model))


def docmask_config(attention: str = "document", dp=1, tp=1, pp=1, engine="1f1b", cp=1, accum=4) -> Config:
    """The tiny model with position ids and ``attention``; ``accum`` micro-batches per step."""
    d = merged(TINY, parallelism={"dp": dp, "tp": tp, "pp": pp, "cp": cp, "pp_engine": engine},
               model={"attention": attention}, tokens={"batch_accumulation_per_replica": accum})
    d["data_stages"][0]["data"]["use_position_ids"] = True
    return build(d)


def hf_config(hf_path: str | Path, dp: int = 1, tp: int = 1, pp: int = 1, **model) -> Config:
    """A run starting from the Hugging Face model at ``hf_path`` (sizes from its config.json)."""
    return build(merged(HF_BASE, model={"init_from_hf": str(hf_path), **model},
                        parallelism={"dp": dp, "tp": tp, "pp": pp, "pp_engine": "afab"}))
