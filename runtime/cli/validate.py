"""Validation loss of a saved checkpoint: ``python -m runtime.evaluate --config CFG --checkpoint CKPT [--json]``.

``--dataset FOLDER`` (repeatable) evaluates on any dataset folder instead of the config's ``validation.datasets``,
a config without a validation section included. ``--task FILE`` (repeatable) scores multiple-choice task files instead
(docs/evaluation.md), each named by its file's stem: the row's ``eval``, as training logs it.

The same validation as during training (``validation`` section of the config, the run's one validation sequence
length), so it prints the value the run logged at that step. One process validates on its own (the checkpoint is
resharded to it); under torchrun the config's parallelism is used. ``CKPT`` is a ``step-N`` folder or a checkpoints
folder with ``latest``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from nanoset.errors import ConfigError, print_error, report_user_errors
from runtime.checkpoint.layout import (
    CHECKPOINT_OPTION,
    check_same_model,
    earlier_checkpoints_hint,
    find_checkpoint,
)
from runtime.checkpoint.record import CheckpointRecord, read_metadata
from runtime.config import Config, ParallelismArgs
from runtime.config.load import load_config
from runtime.config.overrides import add_set_option
from runtime.data.hf_datasets import resolve_stage_folders
from runtime.data.order.holdout import holdout_documents, training_folders
from runtime.data.order.plan import DataPlan
from runtime.data.order.source_names import source_names
from runtime.data.order.surgery import Surgery
from runtime.data.order.validation_sets import ValidationSet, holdout_sets, open_validation_sets
from runtime.evaluation.evaluator import Evaluator, open_tasks
from runtime.evaluation.evaluator import describe as describe_evaluation
from runtime.evaluation.tasks import Task
from runtime.startup import world_size


def layout_for_world(config: Config, world: int) -> Config:
    """The config's parallelism under torchrun; dp = tp = pp = cp = 1 for a single process."""
    if world == 1:
        return dataclasses.replace(config, parallelism=ParallelismArgs())
    config.parallelism.check_world(world)
    return config


def with_datasets(config: Config, folders: list[str]) -> Config:
    """The config evaluating on ``folders`` (``--dataset``, each named by its folder) instead of its
    ``validation.datasets``; the other validation keys (samples, seed) stay."""
    if not folders:
        return config
    return dataclasses.replace(config, validation=dataclasses.replace(
        config.validation, datasets={folder: folder for folder in dict.fromkeys(folders)}))


def prepare(config_path: str, checkpoint: str, overrides: list[str] | None = None, datasets: list[str] | None = None,
            tasks: list[str] | None = None) -> tuple[Config, Path, CheckpointRecord, list[ValidationSet] | list[Task]]:
    """Everything that can be a user mistake, checked before any process group: the validation sets, or with
    ``tasks`` the task files read and encoded with the tokenizer the checkpoint records."""
    config = layout_for_world(with_datasets(load_config(config_path, overrides or ()), datasets or []), world_size())
    if not config.validation.datasets and not config.validation.holdout and not tasks:
        raise ConfigError(f"{config_path}: validation.datasets is empty; name the datasets to evaluate on there, or "
                          f"pass --dataset FOLDER (or --task FILE)")
    path = find_checkpoint(checkpoint, CHECKPOINT_OPTION)
    record = read_metadata(path)
    check_same_model(config, record, path, CHECKPOINT_OPTION)
    if tasks:
        info = record.tokenizer.info if record.tokenizer is not None else None
        return config, path, record, open_tasks(config, info, [(Path(t).stem, t) for t in dict.fromkeys(tasks)])
    return config, path, record, open_validation_sets(config) + ([] if datasets else held_out_sets(config))


def held_out_sets(config: Config) -> list[ValidationSet]:
    """The ``<source>-holdout`` sets of ``validation.holdout``, as the run drew them."""
    if not config.validation.holdout:
        return []
    plan = DataPlan(config, resolve_stage_folders(config), surgery=Surgery())
    return holdout_sets(config, holdout_documents(config, plan), training_folders(plan), source_names(plan))


def run(config: Config, path: Path, record: CheckpointRecord, sets: list[ValidationSet] | list[Task]) -> dict:
    """Build the engine in this layout, load the checkpoint's weights, validate (or score the tasks): the metrics
    row."""
    from runtime.checkpoint.store import load_dcp, model_state
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from runtime.validation import Validator

    p = config.parallelism
    engine = Engine(config, ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp), initialize=False)
    # only the weights, in this layout; a damaged checkpoint names the one before it, as training and export do
    load_dcp({"model": model_state(engine)}, path, earlier_checkpoints_hint(path, CHECKPOINT_OPTION))
    step = record.last_step
    stage = config.stage_at(max(step, 1))
    if sets and isinstance(sets[0], Task):
        return {"step": step, "stage": stage.name, "eval": Evaluator(config, sets, []).evaluate(engine, step)}
    results = Validator(config, sets).validate(engine)
    return {"step": step, "stage": stage.name, "val": results}


def validate_checkpoint(config_path: str, checkpoint: str, as_json: bool, overrides: list[str] | None = None,
                        datasets: list[str] | None = None, tasks: list[str] | None = None) -> int:
    config, path, record, validation_sets = prepare(config_path, checkpoint, overrides, datasets, tasks)
    import torch.distributed as dist

    from runtime.validation import describe

    try:
        row = run(config, path, record, validation_sets)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        lines = describe(row["val"]) if "val" in row else describe_evaluation(row["eval"])
        print(json.dumps(row) if as_json else "\n".join(lines))
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m runtime.evaluate") -> int:
    """``prog``: the name usage lines give the command (``nanoset evaluate`` runs this too)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the run's YAML config, with a validation section (or --dataset)")
    ap.add_argument("--checkpoint", required=True, help="a step-N checkpoint folder, or a folder with `latest`")
    ap.add_argument("--json", action="store_true", help="print the metrics row as JSON")
    ap.add_argument("--dataset", action="append", default=[], dest="datasets", metavar="FOLDER",
                    help="evaluate on this dataset folder instead of validation.datasets (repeatable; named by its "
                         "folder; validation.samples windows of it)")
    ap.add_argument("--task", action="append", default=[], dest="tasks", metavar="FILE",
                    help="score this multiple-choice task file (JSON lines of context, choices, gold) instead of "
                         "validating (repeatable; named by its file's stem)")
    add_set_option(ap)
    args = ap.parse_args(argv)
    # every rank finds a mistake (a damaged checkpoint too): the first rank of each node says it
    first_of_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    return report_user_errors(lambda: validate_checkpoint(args.config, args.checkpoint, args.json, args.overrides,
                                                          args.datasets, args.tasks),
                              report=lambda message: first_of_node and print_error(message))
