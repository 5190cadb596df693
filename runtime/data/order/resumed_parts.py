"""The past of a resumed run spliced into its plan: the parts of every stage the checkpoint has begun, as its record
says, then (when the config changed the stage in progress and ``allow_data_change`` is set) a part from the resume
step on with the config's values. See ``record`` for what a resume may change.
"""

from __future__ import annotations

from typing import Protocol

from nanoset.errors import ConfigError
from runtime.config import Config, DatasetStageArgs
from runtime.data.order.dataset_names import resolved
from runtime.data.order.record import (
    DataStageMetadata,
    PartRecord,
    PartSpec,
    TrainingMetadata,
    data_changed_error,
    differences,
)
from runtime.data.order.sample_space import SampleSpace
from runtime.data.order.stage_plan import StagePlan


class PartMaker(Protocol):
    """What the splice asks of the plan it builds: its datasets and how it makes a part."""

    config: Config
    history: TrainingMetadata
    checkpoint: str
    datasets: list[SampleSpace]
    folders: list[str]
    stage_folders: list[list[str]]

    def dataset_of(self, folder: str, i: int, stage: DatasetStageArgs) -> int: ...

    def new_part(self, i: int, stage: DatasetStageArgs, start: int, end: int, spec: PartSpec, ids: list[int],
                 offsets: list[int], before: StagePlan | None = None, decided: list[list[float]] | None = None
                 ) -> StagePlan: ...


def recorded_parts(plan: PartMaker, i: int, stage: DatasetStageArgs, record: DataStageMetadata, spec: PartSpec,
                   ids: list[int], totals: dict[int, int]) -> list[StagePlan]:
    """The parts of a stage that has begun: as recorded, then (when the config changed the stage in
    progress and ``allow_data_change`` is set) a new part from the resume step on."""
    last = plan.history.last_train_step
    end = plan.config.stage_end_step(stage)
    recorded = record.parts or [_legacy_part(record, spec, plan.history)]
    parts, content = [], {}
    after = dict(totals)
    folders = [_moved(plan, r, ids, plan.stage_folders[i]) for r in recorded]
    for k, r in enumerate(recorded):
        stop = recorded[k + 1].start_step if k + 1 < len(recorded) else end
        part_ids = [plan.dataset_of(folder, i, stage) for folder in folders[k]]
        for d, old, folder in zip(part_ids, r.fingerprints, folders[k]):
            new = plan.datasets[d].reader.fingerprint
            if old != new:
                content[d] = f"{folder} has other content (fingerprint {old} → {new})"
        offsets = r.draw_offsets if r.draw_offsets else [after.get(d, 0) for d in part_ids]
        part = plan.new_part(i, stage, r.start_step, stop, PartSpec.of_record(r, folders[k]), part_ids, offsets,
                             parts[-1] if parts else None, r.decisions)
        parts.append(part)
        part.add_draws(after)
    in_progress = end > last + 1
    old = PartSpec.of_record(recorded[-1], folders[-1])
    changes = differences(plan.config, i, spec, old, in_progress, last + 1)
    if (changes or content) and not plan.config.checkpoints.allow_data_change:
        raise data_changed_error(plan.checkpoint, list(content.values()) + changes, stage.start_training_step,
                                 min(end - 1, last), in_progress)
    last_part = parts[-1]
    if changes and in_progress and (old.adaptive is not None or spec.adaptive is not None):
        raise ConfigError(f"{plan.checkpoint}: data_stages[{i}] ({stage.name}) is adaptive and in progress: "
                          f"{'; '.join(changes)}; an adaptive stage cannot change mid-stage, even with "
                          f"allow_data_change: restore it, or add a new stage from step {last + 1}")
    if changes and in_progress:  # continue the stage from the resume step with the config's values
        parts[-1] = plan.new_part(i, stage, last_part.start_step, last + 1, old, last_part.dataset_ids,
                                  last_part.draw_offsets.tolist(), parts[-2] if len(parts) > 1 else None)
        after = dict(totals)
        for part in parts:
            part.add_draws(after)
        parts.append(plan.new_part(i, stage, last + 1, end, spec, ids, [after.get(d, 0) for d in ids], parts[-1]))
    elif in_progress and spec.schedule is not None and spec.schedule != old.schedule:
        # only the schedule's future changed: the causal blend keeps every step trained so far
        parts[-1] = plan.new_part(i, stage, last_part.start_step, end, PartSpec(
            old.folders, None, old.seed, old.global_batch_size, spec.schedule), last_part.dataset_ids,
            last_part.draw_offsets.tolist(), parts[-2] if len(parts) > 1 else None)
    return parts


def _moved(plan: PartMaker, record: PartRecord, ids: list[int], listed: list[str]) -> list[str]:
    """The folder of each recorded dataset: the stage's folder with its content fingerprint, wherever it is now (a
    dataset copied to another path, mount or node-local disk is the same dataset, and its draws continue there);
    the recorded folder when the stage has no such content (other content there is a change of data)."""
    found = {plan.datasets[d].reader.fingerprint: resolved(f) for d, f in zip(ids, listed)}
    return [found.get(fp, folder)
            for folder, fp in zip(record.datasets, record.fingerprints or [""] * len(record.datasets))]


def _legacy_part(record: DataStageMetadata, spec: PartSpec, history: TrainingMetadata) -> PartRecord:
    """A checkpoint written before parts were recorded: the config's data, the checkpoint's batch size."""
    return PartRecord(record.start_training_step, history.global_batch_size, spec.folders, [], spec.weights,
                      spec.seed, [], "periodic" if spec.schedule is None else "scheduled",
                      spec.schedule.to_json() if spec.schedule is not None else None)


def merged_decisions(recorded: list[list[float]], logged: list[list[float]], name: str) -> list[list[float]]:
    """A checkpoint's decisions, continued by a mixing log's later ones; a log that disagrees with the record is
    not the log of this run."""
    n = min(len(recorded), len(logged))
    if [list(map(float, w)) for w in recorded[:n]] != [list(map(float, w)) for w in logged[:n]]:
        raise ConfigError(f"stage {name!r}: the mixing log's decisions differ from the checkpoint's record; the log "
                          f"belongs to another run (or was edited): give this run's mixing.jsonl")
    return list(recorded) + list(logged[n:])
