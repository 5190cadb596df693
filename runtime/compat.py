"""The names Nanotron users know, as thin wrappers over the runtime's own: loading a config, the stage of a
step, what a checkpoint says of a stage (steps still to run, samples consumed), the loader of a dataset
(``get_train_dataloader``) and the Trainer's two call styles (``NanotronCallStyles``). The runtime itself
calls its own names; these stay for users' scripts.

Every count here is derived from the config and the checkpoint's last completed step, never
accumulated, so it is right in the middle of a stage, at its boundaries and after any number of
restarts (Nanotron's own reports 0 remaining steps mid-stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.config.load import load_config
from runtime.config.schema import Config, DatasetStageArgs
from runtime.data.order.record import TrainingMetadata

__all__ = ["NanotronCallStyles", "compute_remain_train_steps_of_a_data_stage_from_ckp", "get_config_from_yaml",
           "get_consumed_train_samples_of_a_data_stage_from_ckp", "get_stage_for_step", "get_train_dataloader"]

_RUNTIME_SEEDING: Any = object()  # get_train_dataloader's seed_worker default: the runtime's own seeding


def get_config_from_yaml(path: str | Path) -> Config:
    """``load_config`` under its Nanotron name."""
    return load_config(path)


def get_stage_for_step(config: Config, step: int) -> DatasetStageArgs:
    """The stage that global step ``step`` (1-based) belongs to."""
    return config.stage_at(step)


def compute_remain_train_steps_of_a_data_stage_from_ckp(stage: DatasetStageArgs, config: Config,
                                                        metadata: TrainingMetadata) -> int:
    """Steps of ``stage`` still to run after the checkpoint (its full length if it has not begun)."""
    end = config.stage_end_step(stage)
    return max(end - max(stage.start_training_step, metadata.last_train_step + 1), 0)


def get_consumed_train_samples_of_a_data_stage_from_ckp(stage: DatasetStageArgs,
                                                       metadata: TrainingMetadata) -> int | None:
    """Samples of ``stage`` consumed at the checkpoint; None if the checkpoint does not know the stage."""
    return next((s.consumed_train_samples for s in metadata.data_stages
                 if s.start_training_step == stage.start_training_step and s.name == stage.name), None)


def get_train_dataloader(train_dataset: Any, sequence_length: int, parallel_context: Any, input_pp_rank: int,
                         output_pp_rank: int, micro_batch_size: int, consumed_train_samples: int = 0,
                         dataloader_num_workers: int = 0, seed_worker: Any = _RUNTIME_SEEDING,
                         dataloader_drop_last: bool = True, dataloader_pin_memory: bool = True,
                         use_position_ids: bool = False, seed: int = 0, shuffle: bool = False,
                         prefetch: int = 0) -> Any:
    """``runtime.data.loading.dataloader.build_loader`` under Nanotron's name and arguments: the inputs on pipeline
    rank ``input_pp_rank``, the labels on ``output_pp_rank``; ``parallel_context`` needs ``dp_rank``, ``dp_size`` and
    ``pp_rank``; ``seed_worker``: each loader worker's seeding (None: none)."""
    from runtime.data.loading.dataloader import build_loader  # torch: loaded when a loader is asked for

    options = {} if seed_worker is _RUNTIME_SEEDING else {"worker_init": seed_worker}
    return build_loader(train_dataset, sequence_length, parallel_context, micro_batch_size, consumed_train_samples,
                        num_workers=dataloader_num_workers, use_position_ids=use_position_ids, prefetch=prefetch,
                        pipeline_ends=(input_pp_rank, output_pp_rank), drop_last=dataloader_drop_last,
                        pin_memory=dataloader_pin_memory, seed=seed, shuffle=shuffle, **options)


class NanotronCallStyles:
    """The Trainer's two call styles from Nanotron: ``trainer.train(dataloader_or_dls=...)``, and
    ``trainer.train_dataloader = loader; trainer.fit()``. Both are ``Trainer.run``, the runtime's own."""

    train_dataloader: Any = None  # what fit() trains on; None: the config's stages
    run: Any  # Trainer.run(loaders=None) -> TrainSummary

    def train(self, dataloader_or_dls: Any = None) -> Any:
        """Train on ``dataloader_or_dls``: None (the config's stages), one loader for the whole run, or a dict of
        stage name → loader or callable returning one."""
        return self.run(dataloader_or_dls)

    def fit(self) -> Any:
        """Train on ``self.train_dataloader`` (the config's stages when it is None)."""
        return self.run(self.train_dataloader)
