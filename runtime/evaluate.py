"""Validation loss of a saved checkpoint: ``python -m runtime.evaluate --config CFG --checkpoint CKPT [--json]``.

The same evaluation as during training (``validation`` section of the config, the sequence length and
position-id rule of the stage the checkpoint's step belongs to), so it prints the value the run logged
at that step. One process evaluates on its own (the checkpoint is resharded to it); under torchrun the
config's parallelism is used. ``CKPT`` is a ``step-N`` folder or a checkpoints folder with ``latest``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from nanoset.errors import NanosetError
from runtime.config import Config, ConfigError, ParallelismArgs
from runtime.config.load import load_config
from runtime.data.heldout import HeldOutSet, open_heldout
from runtime.run_start import LATEST, check_same_model, read_metadata, resolve_checkpoint

USER_ERRORS = (ConfigError, NanosetError, FileNotFoundError)


def checkpoint_path(given: str) -> Path:
    """A ``step-N`` folder, or a checkpoints folder whose ``latest`` names one."""
    path = Path(given)
    if (path / "metadata.json").is_file():
        return path
    if (path / LATEST).is_file():
        return resolve_checkpoint(path, LATEST)
    what = "no such folder" if not path.exists() else "neither a checkpoint (metadata.json) nor a folder with `latest`"
    raise FileNotFoundError(f"--checkpoint {path}: {what}")


def layout_for_world(config: Config, world: int) -> Config:
    """The config's parallelism under torchrun; dp = tp = pp = 1 for a single process."""
    p = config.parallelism
    if world == p.dp * p.tp * p.pp:
        return config
    if world == 1:
        return dataclasses.replace(config, parallelism=ParallelismArgs())
    raise ConfigError(f"parallelism tp {p.tp} × pp {p.pp} × dp {p.dp} = {p.dp * p.tp * p.pp} processes, but {world} "
                      f"were launched; run one process, or torchrun --nproc_per_node={p.dp * p.tp * p.pp}")


def prepare(config_path: str, checkpoint: str) -> tuple[Config, Path, dict, list[HeldOutSet]]:
    """Everything that can be a user mistake, checked before any process group."""
    config = layout_for_world(load_config(config_path), int(os.environ.get("WORLD_SIZE", "1")))
    if not config.validation.datasets:
        raise ConfigError(f"{config_path}: validation.datasets is empty; name the datasets to evaluate on")
    path = checkpoint_path(checkpoint)
    metadata = read_metadata(path)
    check_same_model(config, metadata, path)
    return config, path, metadata, open_heldout(config)


def run(config: Config, path: Path, metadata: dict, heldout: list[HeldOutSet]) -> dict:
    """Build the engine in this layout, load the checkpoint's weights, evaluate: the metrics row."""
    from runtime.checkpoint import model_state
    from runtime.checkpoint_read import load_dcp
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from runtime.validation import evaluate

    p = config.parallelism
    engine = Engine(config, ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp), initialize=False)
    load_dcp({"model": model_state(engine)}, path, "choose another checkpoint")  # only the weights, in this layout
    step = int(metadata["training"]["last_train_step"])
    stage = config.stage_at(max(step, 1))
    results = evaluate(engine, heldout, config.stage_sequence_length(stage), stage.data.use_position_ids)
    return {"step": step, "stage": stage.name, "val": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the run's YAML config, with a validation section")
    ap.add_argument("--checkpoint", required=True, help="a step-N checkpoint folder, or a folder with `latest`")
    ap.add_argument("--json", action="store_true", help="print the metrics row as JSON")
    args = ap.parse_args(argv)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        config, path, metadata, heldout = prepare(args.config, args.checkpoint)
    except USER_ERRORS as e:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"error: {e}", file=sys.stderr)
        return 1
    import torch.distributed as dist

    from runtime.validation import describe

    try:
        row = run(config, path, metadata, heldout)
    except USER_ERRORS as e:  # a damaged checkpoint: every rank finds it
        if main_rank:
            print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if main_rank:
        if args.json:
            print(json.dumps(row))
        else:
            print("\n".join(describe(row["val"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
