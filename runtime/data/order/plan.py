"""The data order as a pure function of (config, step): stages, blends, epochs, permutations.

Nothing here is stored or iterated from the beginning: sample ``j`` of stage ``s`` is located
in O(1) - blend slot → dataset and draw number → epoch and position → permutation (constant
weights blend by a greedy period, a weight schedule by per-step counts computed once: see
``blend`` and ``scheduled_blend``). Global step
``t`` of stage ``s`` uses stage samples ``[(t - start_s)·G, (t - start_s + 1)·G)``. A dataset
(content fingerprint and sequence length: a copy in another folder is the same dataset) used by
several stages continues its draws where the earlier stages left it, so nothing repeats before the
dataset is exhausted.

A resumed run passes the checkpoint's record (``history``): the stages that have begun are then
taken from the record - their global batch size, datasets, weights, seed and the draws each
dataset had taken - and only what follows is computed from the config. So a new global batch
size at a stage boundary, or a stage added later, never repeats or skips data. A stage that a
resume changed (with ``allow_data_change``) is split into two parts at the resume step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from nanoset import NanosetError, open_dataset
from runtime.config import Config, ConfigError, DatasetStageArgs, NanosetDatasetsArgs
from runtime.data.order.adaptive_blend import NotDecided
from runtime.data.order.dataset_names import DatasetNames, check_listed_once, resolved
from runtime.data.order.excision import DrawIndex, draw_indexes
from runtime.data.order.packing import PackedDocuments
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.record import (
    DataStageMetadata,
    PartRecord,
    PartSpec,
    TrainingMetadata,
    adaptive_options,
    packing_mode,
    started_stages,
)
from runtime.data.order.resumed_parts import merged_decisions, recorded_parts
from runtime.data.order.sample_space import SampleSpace
from runtime.data.order.scheduled_blend import WeightSchedule
from runtime.data.order.stage_blend import part_blend
from runtime.data.order.stage_plan import DatasetReads, SampleLocation, StagePlan
from runtime.data.order.surgery import Surgery, config_surgery
from runtime.data.order.vocab import SeenTokenizer, check_same_tokenizer, check_unknown_beside_known, check_vocab
from runtime.data.order.windows import TokenWindows


class DataPlan:
    """All stages of a config over their opened datasets; ``locate`` any stage sample in O(1).

    ``history`` is the record of the checkpoint a run resumes from (``checkpoint`` names it in
    errors); without it the whole order comes from the config. ``surgery``: the steps skipped and the
    documents excised (``runtime.data.order.surgery``), an input of the order like the config; by default the
    config's ``surgery:`` section (a run also adds what its run folder and checkpoint record).
    """

    def __init__(self, config: Config, stage_folders: list[list[str]] | None = None,
                 history: TrainingMetadata | None = None, checkpoint: str | None = None,
                 readers: dict[str, object] | None = None, surgery: Surgery | None = None,
                 decisions: dict[str, list[list[float]]] | None = None) -> None:
        """``surgery``: the data surgery in force (default: the config's); ``decisions``: per adaptive stage (by
        name), the decided weights of its blocks 3, 4, ... (a mixing log's, see ``mixing_log``); the checkpoint's
        record holds those decided by its step."""
        self.config = config
        self.surgery = surgery if surgery is not None else config_surgery(config)
        self.decisions = decisions or {}
        if stage_folders is None:
            stage_folders = [_nanoset_folders(s, i) for i, s in enumerate(config.data_stages)]
        self.stage_folders = stage_folders
        self.history = history
        self.checkpoint = str(checkpoint) if history is not None else None
        self.datasets: list[SampleSpace] = []
        self.names = DatasetNames(config, stage_folders, _recorded_folders(history))
        self.folders = self.names.locations  # resolved folder of each dataset
        self._keys: dict[tuple[str, int, str, bool], int] = {}
        self._seeds: dict[int, int] = {}  # the first part to draw from a dataset keys its order
        self._perms: dict[tuple[int, int], FeistelPermutation] = {}
        self._readers: dict[str, object] = readers if readers is not None else {}
        self.stages: list[StagePlan] = []
        records = started_stages(config, history, self.checkpoint) if history is not None else {}
        totals: dict[int, int] = {}  # draws taken from each dataset so far
        for i, stage in enumerate(config.data_stages):
            ids = [self.dataset_of(folder, i, stage) for folder in stage_folders[i]]
            check_listed_once(ids, [self.datasets[d].reader.fingerprint for d in ids], stage_folders[i], i, stage)
            weights, schedule = _weights(stage)
            adaptive = _adaptive(stage, len(ids))
            spec = PartSpec([resolved(f) for f in stage_folders[i]], weights, config.stage_seed(stage),
                            config.global_batch_size, schedule, adaptive)
            if i in records:
                parts = recorded_parts(self, i, stage, records[i], spec, ids, totals)
            else:
                parts = [self.new_part(i, stage, stage.start_training_step, config.stage_end_step(stage), spec, ids,
                                    [totals.get(d, 0) for d in ids])]
            for part in parts:
                part.add_draws(totals)
            self.stages.extend(parts)
        self._check_tokenizers()
        self.draw_indexes = self._excise()

    def resumed_from(self, checkpoint: str | Path | None, history: TrainingMetadata | None) -> DataPlan:
        """This plan for a run resuming from ``checkpoint`` (``history``: its record of the data, the ``training``
        of its ``CheckpointRecord``), the past taken from it; itself when there is no checkpoint or it has this one
        already."""
        if checkpoint is None or self.checkpoint == str(checkpoint):
            return self
        return DataPlan(self.config, self.stage_folders, history, str(checkpoint), self._readers, self.surgery,
                        self.decisions)

    def with_surgery(self, surgery: Surgery) -> DataPlan:
        """This plan with ``surgery`` in force instead of its own (the same past, datasets, readers and decisions)."""
        return DataPlan(self.config, self.stage_folders, self.history, self.checkpoint, self._readers, surgery,
                        self.decisions)

    # ---------------------------------------------------------------- construction --------------

    def dataset_of(self, folder: str, i: int, stage: DatasetStageArgs) -> int:
        seq = self.config.stage_sequence_length(stage)
        data = stage.data
        location = resolved(folder)
        if location not in self._readers:
            self._readers[location] = _open(folder, i, stage)
        # a dataset is its content: a copy of it in another folder is the same dataset (its draws go on)
        key = (self._readers[location].fingerprint, seq, packing_mode(stage))
        if key not in self._keys:
            if data.packing == "documents":
                windows = PackedDocuments(folder, seq, self._readers[location], self.config.general.cache_path,
                                          data.drop_long_documents)
                if windows.reader.num_tokens == 0:
                    raise ConfigError(f"data_stages[{i}] ({stage.name}): {folder} has no tokens to pack; add data")
                if windows.num_samples == 0:
                    raise ConfigError(f"data_stages[{i}] ({stage.name}).data.drop_long_documents: every document of "
                                      f"{folder} is longer than sequence_length + 1 = {seq + 1} and was dropped; "
                                      f"raise sequence_length or set drop_long_documents: false to truncate them")
            else:
                windows = TokenWindows(folder, seq, self._readers[location])
            if windows.num_samples == 0:
                raise ConfigError(f"data_stages[{i}] ({stage.name}): {folder} has "
                                  f"{windows.reader.num_tokens} tokens, too few for one window of "
                                  f"{seq + 1}; lower sequence_length or add data")
            self._keys[key] = len(self.datasets)
            self.datasets.append(windows)
            self.names.add(location, folder, windows.reader.fingerprint)
        self.names.also(self._keys[key], location, folder)
        return self._keys[key]

    def new_part(self, i: int, stage: DatasetStageArgs, start: int, end: int, spec: PartSpec, ids: list[int],
              offsets: list[int], before: StagePlan | None = None, decided: list[list[float]] | None = None
              ) -> StagePlan:
        """A part of stage ``i``; ``before``: the stage's previous part, whose deviation from its schedule's
        targets a scheduled part over the same datasets carries on (so the rule holds across a resume that
        changed the global batch size); ``decided``: an adaptive part's decisions as a checkpoint recorded them."""
        for d in ids:
            self._seeds.setdefault(d, spec.seed)
        carried = before is not None and before.schedule is not None and before.dataset_ids == ids
        blend = part_blend(spec.weights, spec.schedule, spec.adaptive, start, end - start, spec.global_batch_size,
                           before.blend.deviation if carried else None,
                           merged_decisions(decided or [], self.decisions.get(stage.name, []), stage.name),
                           self.config.general.cache_path,
                           f"data_stages[{i}] ({stage.name}).data.dataset.dataset_weights")
        return StagePlan(
            index=i, name=stage.name, start_step=start, end_step=end,
            sequence_length=self.config.stage_sequence_length(stage), global_batch_size=spec.global_batch_size,
            seed=spec.seed, use_position_ids=stage.data.use_position_ids,
            num_loading_workers=stage.data.num_loading_workers, prefetch=stage.data.prefetch,
            dataset_ids=ids, folders=list(spec.folders), blend=blend, draw_offsets=np.array(offsets, dtype=np.int64))

    def _excise(self) -> list[DrawIndex]:
        """Each dataset's draw index under the plan's surgery (``excision.draw_indexes``): an exclusion from a step
        whose earlier steps are not all decided (past an adaptive stage's decided blocks) starts at a draw not known
        yet, so it waits, and ``decide`` builds the indexes again once it is known."""
        def known(step: int) -> bool:
            open_part = self.undecided(step)
            return open_part is None or open_part[1] >= step
        self._waiting = not all(known(step) for step in self.surgery.exclusions)
        return draw_indexes(self.surgery.exclusions, self.datasets, self.names.named, self.surgery.shown,
                            self._draws_before, self.permutation, known)

    def _draws_before(self, step: int) -> dict[int, int]:
        """Draws taken from each dataset by steps ``1..step - 1`` (draw numbers, the blend's count)."""
        totals: dict[int, int] = {}
        for part in self.stages:
            if part.start_step <= step - 1:
                part.add_draws(totals, part.consumed_samples(step - 1))
        return totals

    def datasets_named(self, folder: str, where: str = "") -> list[int]:
        """The plan's datasets (one per sequence length and packing) read from ``folder``: a folder of a stage, or
        the Hugging Face source of a stage (whose tokenized copy the plan reads); ``where`` names the asking key."""
        return self.names.named(folder, where)

    # ---------------------------------------------------------------- lookups -------------------

    def stage_for_step(self, step: int) -> StagePlan:
        """The stage part that trains global step ``step``: the last one begun by then in its config stage."""
        index = self.config.data_stages.index(self.config.stage_at(step))
        return next(s for s in reversed(self.stages) if s.index == index and s.start_step <= step)

    def permutation(self, dataset: int, epoch: int) -> FeistelPermutation:
        key = (dataset, epoch)
        if key not in self._perms:
            w = self.datasets[dataset]
            self._perms[key] = FeistelPermutation(w.num_samples, self._seeds[dataset], w.reader.fingerprint,
                                                  w.sequence_length, epoch)
        return self._perms[key]

    def undecided(self, before_step: int | None = None) -> tuple[StagePlan, int] | None:
        """The first adaptive part (starting before ``before_step``, default any) with steps not decided yet, and its
        first such step; None when every adaptive step is decided."""
        for part in self.stages:
            decided = part.decided_samples()
            if decided < part.num_samples and (before_step is None or part.start_step < before_step):
                return part, part.start_step + decided // part.global_batch_size
        return None

    def locate(self, stage: StagePlan, j: np.ndarray | int) -> SampleLocation:
        """Dataset, window index, epoch and source of stage samples ``j`` (a scalar or an array; same shape out)."""
        open_part = self.undecided(stage.start_step)
        if open_part is not None:  # a later stage's draws continue from an adaptive stage's, not all known
            raise NotDecided(f"stage {stage.name!r} follows adaptive stage {open_part[0].name!r}, whose steps from "
                             f"{open_part[1]} are not decided yet")
        shape = np.shape(j)
        j = np.asarray(j, dtype=np.int64).reshape(-1)
        local, draw = stage.blend.locate(j)
        dataset = np.asarray(stage.dataset_ids, dtype=np.int64)[local]
        draw = draw + stage.draw_offsets[local]
        for d in np.unique(dataset).tolist():  # surgery: excised samples passed over (O(log E) a draw)
            if self.draw_indexes[d].excised:
                m = dataset == d
                draw[m] = self.draw_indexes[d].positions(draw[m])
        sizes = np.array([self.datasets[d].num_samples for d in stage.dataset_ids], dtype=np.int64)[local]
        epoch, pos = np.divmod(draw, sizes)
        sample = np.empty_like(pos)
        for d, e in set(zip(dataset.tolist(), epoch.tolist())):
            m = (dataset == d) & (epoch == e)
            sample[m] = self.permutation(d, e)(pos[m])
        return SampleLocation(*(a.reshape(shape)[()] for a in (dataset, sample, epoch, local)))

    def global_batch(self, step: int) -> tuple[StagePlan, SampleLocation]:
        """The G samples of global step ``step``, in global order."""
        stage = self.stage_for_step(step)
        g = stage.global_batch_size
        first = (step - stage.start_step) * g
        return stage, self.locate(stage, np.arange(first, first + g))

    def data_hash(self, step: int, loc: SampleLocation | None = None) -> str:
        """A short hash of the ordered (dataset, sample) ids of step ``step``'s global batch (``loc``: that batch,
        when the caller has located it already)."""
        if loc is None:
            _, loc = self.global_batch(step)
        h = hashlib.sha256()
        for d, s in zip(loc.dataset.tolist(), loc.sample.tolist()):
            w = self.datasets[d]
            h.update(f"{w.sample_key}:{s};".encode())
        return h.hexdigest()[:16]

    def source_names(self) -> dict[str, str]:
        """Each dataset's folder as ``explain`` prints it → what the config calls it (``DatasetNames.sources``)."""
        return self.names.sources()

    def decide(self, stage: StagePlan, weights: list[float]) -> None:
        """The weights of the next block of adaptive ``stage`` (decided at the end of the block two before); later
        stages' draws continue from the draws it now has."""
        stage.blend.add_block(weights)
        totals: dict[int, int] = {}
        for part in self.stages:
            if part.start_step > stage.start_step:
                part.draw_offsets = np.array([totals.get(d, 0) for d in part.dataset_ids], dtype=np.int64)
            part.add_draws(totals)
        if self._waiting:
            self.draw_indexes = self._excise()

    def reads(self, part: StagePlan) -> list[DatasetReads]:
        """Per dataset of ``part``, in its folder order: what the part draws from it, and whether that repeats (of an
        adaptive part: over its decided steps)."""
        draws = part.blend.draws(part.decided_samples()).tolist()
        return [DatasetReads(d, offset, n, self.datasets[d].num_samples)
                for d, offset, n in zip(part.dataset_ids, part.draw_offsets.tolist(), draws)]

    def shown_names(self) -> dict[str, str]:
        """Each dataset's folder → how the run names it to a user (``DatasetNames.shown``)."""
        return self.names.shown()

    def consumed_samples(self, last_step: int) -> int:
        """Samples of all stages used once global steps ``1..last_step`` are done."""
        return sum(s.consumed_samples(last_step) for s in self.stages)

    def draws_after(self, last_step: int) -> dict[str, int]:
        """Positions of each dataset's stream (resolved folder@sequence length) walked once steps ``1..last_step``
        are done: its draws, and the excised samples they passed over."""
        totals = {d: self.stream_position(d, n) for d, n in self._draws_before(last_step + 1).items()}
        return {_draws_key(self.folders[d], self.datasets[d]): n for d, n in sorted(totals.items())}

    def stream_position(self, dataset: int, draws: int) -> int:
        """The position in ``dataset``'s stream after its first ``draws`` draws (passed-over samples counted)."""
        return self.draw_indexes[dataset].stream_position(draws)

    def passed_over(self, part: StagePlan) -> list[tuple[int, int, int]]:
        """Per excised dataset of ``part``: (dataset, excluded documents of it, samples its draws pass over)."""
        out = []
        docs: dict[int, int] = {}
        for folder, count in self.surgery.count().items():
            for d in self.names.named(folder, "surgery", self.surgery.shown(folder)):
                docs[d] = docs.get(d, 0) + count
        for d, offset, n in zip(part.dataset_ids, part.draw_offsets.tolist(), part.blend.draws(part.num_samples)):
            if self.draw_indexes[d].excised and n:
                walked = self.stream_position(d, offset + int(n)) - self.stream_position(d, offset)
                out.append((d, docs.get(d, 0), walked - int(n)))
        return out

    def record(self, last_step: int) -> list[DataStageMetadata]:
        """Per config stage, what a checkpoint after ``last_step`` records (parts only for stages begun)."""
        out = []
        for i, stage in enumerate(self.config.data_stages):
            parts = [p for p in self.stages if p.index == i]
            out.append(DataStageMetadata(
                stage.name, stage.start_training_step, sum(p.consumed_samples(last_step) for p in parts),
                parts[0].sequence_length,
                [PartRecord(p.start_step, p.global_batch_size, p.folders,
                            [self.datasets[d].reader.fingerprint for d in p.dataset_ids], seed=p.seed,
                            draw_offsets=p.draw_offsets.tolist(), **p.blend.record(last_step))
                 for p in parts if p.start_step <= last_step],
                packing_mode(stage)))
        return out

    @property
    def fingerprint(self) -> str:
        """Changes when any dataset's content changes (manifest checksums, or datatrove sizes), not where it is."""
        payload = [(w.sequence_length, w.reader.fingerprint) + (() if w.packing == "window" else (w.mode,))
                   for w in self.datasets]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def _check_tokenizers(self) -> None:
        """All datasets share one tokenizer, and every token id fits the model's vocabulary."""
        seen: list[SeenTokenizer] = []
        for w in self.datasets:
            seen = check_same_tokenizer(w.reader, w.folder, seen)
            check_vocab(w.reader, w.folder, self.config.model.vocab_size)
        check_unknown_beside_known([(w.reader, w.folder) for w in self.datasets], seen, "data_stages")


def _recorded_folders(history: TrainingMetadata | None) -> dict[str, str]:
    """The folders a checkpoint's record names → the content fingerprint each held then."""
    parts = [p for s in history.data_stages for p in s.parts] if history is not None else []
    return {f: fp for p in parts for f, fp in zip(p.datasets, p.fingerprints)}


def _draws_key(folder: str, dataset: SampleSpace) -> str:
    """``folder@L`` for windows, ``folder@L/documents-MODE`` for packed samples (another sample space)."""
    suffix = "" if dataset.packing == "window" else f"/{dataset.mode}"
    return f"{folder}@{dataset.sequence_length}{suffix}"


def _adaptive(stage: DatasetStageArgs, num_folders: int) -> dict | None:
    """The recorded options of an adaptive stage (None for constant weights or a schedule)."""
    ds = stage.data.dataset
    args = ds.adaptive if isinstance(ds, NanosetDatasetsArgs) else None
    return adaptive_options(args, num_folders) if args is not None else None


def _weights(stage: DatasetStageArgs) -> tuple[list[float] | None, WeightSchedule | None]:
    """(constant weights, None) or (None, the weight schedule) of a stage; one dataset of a Hugging Face stage."""
    ds = stage.data.dataset
    if not isinstance(ds, NanosetDatasetsArgs):
        return [1.0], None
    if ds.schedule is not None:
        return None, WeightSchedule.from_entries(ds.schedule)
    if ds.adaptive is not None:
        return None, None
    return list(ds.weights), None


def _nanoset_folders(stage: DatasetStageArgs, i: int) -> list[str]:
    ds = stage.data.dataset
    if not isinstance(ds, NanosetDatasetsArgs):
        raise ConfigError(f"data_stages[{i}] ({stage.name}) uses a Hugging Face dataset; prepare it first with "
                          f"runtime.data.hf_datasets.resolve_stage_folders(config)")
    return ds.folders


def _open(folder: str, i: int, stage: DatasetStageArgs):
    try:
        return open_dataset(folder)
    except NanosetError as e:
        raise ConfigError(f"data_stages[{i}] ({stage.name}).data.dataset.dataset_folder: {e}") from None


def training_metadata(plan: DataPlan, last_step: int) -> TrainingMetadata:
    """The metadata of a run whose steps ``1..last_step`` are done, with the record of what they trained."""
    config = plan.config
    current = plan.stage_for_step(last_step) if last_step >= 1 else plan.stages[0]
    return TrainingMetadata(
        last_train_step=last_step, consumed_train_samples=plan.consumed_samples(last_step),
        last_stage_idx=current.index, global_batch_size=config.global_batch_size, data_stages=plan.record(last_step),
        draws_per_dataset=plan.draws_after(last_step), data_fingerprint=plan.fingerprint)

