"""The data order as a pure function of (config, step): stages, blends, epochs, permutations.

Nothing here is stored or iterated from the beginning: sample ``j`` of stage ``s`` is located
in O(1) - blend slot → dataset and draw number → epoch and position → permutation. Global step
``t`` of stage ``s`` uses stage samples ``[(t - start_s)·G, (t - start_s + 1)·G)``. A dataset
(folder and sequence length) used by several stages continues its draws where the earlier
stages left it, so nothing repeats before the dataset is exhausted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nanoset import NanosetError, TokenizerInfo, open_dataset
from runtime.config import Config, ConfigError, DatasetStageArgs, NanosetDatasetsArgs
from runtime.data.blend import BlendSchedule
from runtime.data.permutation import FeistelPermutation
from runtime.data.windows import TokenWindows


@dataclass
class StagePlan:
    """One data stage: global steps ``[start_step, end_step)`` and how its samples are drawn."""

    index: int
    name: str
    start_step: int
    end_step: int
    sequence_length: int
    global_batch_size: int
    seed: int
    use_position_ids: bool
    num_loading_workers: int
    dataset_ids: list[int]  # indices into DataPlan.datasets, in the stage's folder order
    weights: list[float]
    blend: BlendSchedule
    draw_offsets: np.ndarray = field(repr=False)  # draws taken by earlier stages, per stage dataset

    @property
    def num_steps(self) -> int:
        return self.end_step - self.start_step

    @property
    def num_samples(self) -> int:
        return self.num_steps * self.global_batch_size

    def consumed_samples(self, last_step: int) -> int:
        """Stage samples used once global steps ``1..last_step`` are done."""
        done = min(max(last_step - self.start_step + 1, 0), self.num_steps)
        return done * self.global_batch_size


@dataclass
class SampleLocation:
    """Where samples come from: per sample, the dataset index, window index and epoch."""

    dataset: np.ndarray
    sample: np.ndarray
    epoch: np.ndarray


class DataPlan:
    """All stages of a config over their opened datasets; ``locate`` any stage sample in O(1)."""

    def __init__(self, config: Config, stage_folders: list[list[str]] | None = None) -> None:
        self.config = config
        if stage_folders is None:
            stage_folders = [_nanoset_folders(config, s, i) for i, s in enumerate(config.data_stages)]
        self.datasets: list[TokenWindows] = []
        self._keys: dict[tuple[str, int], int] = {}
        self._seeds: list[int] = []
        self._perms: dict[tuple[int, int], FeistelPermutation] = {}
        readers: dict[str, object] = {}
        self.stages: list[StagePlan] = []
        total_draws: dict[int, int] = {}
        for i, stage in enumerate(config.data_stages):
            seq = config.stage_sequence_length(stage)
            ids = []
            for folder in stage_folders[i]:
                key = (str(Path(folder).resolve()), seq)
                if key not in self._keys:
                    if key[0] not in readers:
                        readers[key[0]] = _open(folder, i, stage)
                    windows = TokenWindows(folder, seq, readers[key[0]])
                    if windows.num_samples == 0:
                        raise ConfigError(f"data_stages[{i}] ({stage.name}): {folder} has "
                                          f"{windows.reader.num_tokens} tokens, too few for one window of "
                                          f"{seq + 1}; lower sequence_length or add data")
                    self._keys[key] = len(self.datasets)
                    self.datasets.append(windows)
                    self._seeds.append(config.stage_seed(stage))  # the first stage to use it keys its order
                ids.append(self._keys[key])
            end = config.stage_end_step(stage)
            weights = stage.data.dataset.weights if isinstance(stage.data.dataset, NanosetDatasetsArgs) else [1.0]
            plan = StagePlan(
                index=i, name=stage.name, start_step=stage.start_training_step, end_step=end, sequence_length=seq,
                global_batch_size=config.global_batch_size, seed=config.stage_seed(stage),
                use_position_ids=stage.data.use_position_ids, num_loading_workers=stage.data.num_loading_workers,
                dataset_ids=ids, weights=weights, blend=BlendSchedule(weights),
                draw_offsets=np.array([total_draws.get(d, 0) for d in ids], dtype=np.int64),
            )
            for d, n in zip(ids, plan.blend.draws(plan.num_samples)):
                total_draws[d] = total_draws.get(d, 0) + int(n)
            self.stages.append(plan)
        self._check_tokenizers()

    # ---------------------------------------------------------------- lookups -------------------

    def stage_for_step(self, step: int) -> StagePlan:
        if not 1 <= step <= self.config.tokens.train_steps:
            raise ValueError(f"step {step} is outside [1, tokens.train_steps={self.config.tokens.train_steps}]")
        return next(s for s in reversed(self.stages) if s.start_step <= step)

    def permutation(self, dataset: int, epoch: int) -> FeistelPermutation:
        key = (dataset, epoch)
        if key not in self._perms:
            w = self.datasets[dataset]
            self._perms[key] = FeistelPermutation(w.num_samples, self._seeds[dataset], w.reader.fingerprint,
                                                  w.sequence_length, epoch)
        return self._perms[key]

    def locate(self, stage: StagePlan, j: np.ndarray) -> SampleLocation:
        """Dataset, window index and epoch of stage samples ``j`` (vectorised)."""
        j = np.asarray(j, dtype=np.int64)
        local, draw = stage.blend.locate(j)
        dataset = np.asarray(stage.dataset_ids, dtype=np.int64)[local]
        draw = draw + stage.draw_offsets[local]
        sizes = np.array([self.datasets[d].num_samples for d in stage.dataset_ids], dtype=np.int64)[local]
        epoch, pos = np.divmod(draw, sizes)
        sample = np.empty_like(pos)
        for d, e in set(zip(dataset.tolist(), epoch.tolist())):
            m = (dataset == d) & (epoch == e)
            sample[m] = self.permutation(d, e)(pos[m])
        return SampleLocation(dataset, sample, epoch)

    def global_batch(self, step: int) -> tuple[StagePlan, SampleLocation]:
        """The G samples of global step ``step``, in global order."""
        stage = self.stage_for_step(step)
        g = stage.global_batch_size
        first = (step - stage.start_step) * g
        return stage, self.locate(stage, np.arange(first, first + g))

    def data_hash(self, step: int) -> str:
        """A short hash of the ordered (dataset, sample) ids of step ``step``'s global batch."""
        _, loc = self.global_batch(step)
        h = hashlib.sha256()
        for d, s in zip(loc.dataset.tolist(), loc.sample.tolist()):
            w = self.datasets[d]
            h.update(f"{w.reader.fingerprint}/{w.sequence_length}:{s};".encode())
        return h.hexdigest()[:16]

    def draws_after(self, last_step: int) -> dict[str, int]:
        """Samples drawn from each dataset (folder@sequence length) once steps ``1..last_step`` are done."""
        out: dict[str, int] = {}
        for stage in self.stages:
            counts = stage.blend.draws(stage.consumed_samples(last_step))
            for d, n in zip(stage.dataset_ids, counts):
                w = self.datasets[d]
                name = f"{w.folder}@{w.sequence_length}"
                out[name] = out.get(name, 0) + int(n)
        return out

    @property
    def fingerprint(self) -> str:
        """Changes when any dataset's content changes (manifest checksums, or datatrove sizes)."""
        payload = [(w.folder, w.sequence_length, w.reader.fingerprint) for w in self.datasets]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def _check_tokenizers(self) -> None:
        """All datasets share one tokenizer, and every token id fits the model's vocabulary.

        Tokenizers are compared by sha256 when both folders record one, else by name (a datatrove
        folder records only the name); the largest id comes from the manifest or a cached scan.
        """
        vocab = self.config.model.vocab_size
        kinds: list[tuple[TokenizerInfo, str]] = []  # one (tokenizer, first folder) per distinct record
        for w in self.datasets:
            tok = w.reader.tokenizer
            if tok is not None:
                for other, folder in kinds:
                    if not tok.same_as(other):
                        raise ConfigError(f"data_stages: datasets were tokenized with different tokenizers: "
                                          f"{folder} ({other.describe()}) and {w.folder} ({tok.describe()}); "
                                          f"re-tokenize them with one tokenizer")
                if all((tok.name, tok.sha256) != (o.name, o.sha256) for o, _ in kinds):
                    kinds.append((tok, w.folder))
            if tok and tok.vocab_size and tok.vocab_size > vocab:
                raise ConfigError(f"model.vocab_size {vocab} < vocab size {tok.vocab_size} of the tokenizer of "
                                  f"{w.folder}; raise model.vocab_size to at least {tok.vocab_size}")
            top = w.reader.max_token_id
            if top >= vocab:
                raise ConfigError(f"{w.folder}: holds token id {top}, ≥ model.vocab_size {vocab}; raise "
                                  f"model.vocab_size to at least {top + 1}, or use data made with the model's tokenizer")


def _nanoset_folders(config: Config, stage: DatasetStageArgs, i: int) -> list[str]:
    ds = stage.data.dataset
    if not isinstance(ds, NanosetDatasetsArgs):
        raise ConfigError(f"data_stages[{i}] ({stage.name}) uses a Hugging Face dataset; prepare it first with "
                          f"runtime.data.hf_cache.resolve_stage_folders(config)")
    return ds.folders


def _open(folder: str, i: int, stage: DatasetStageArgs):
    try:
        return open_dataset(folder)
    except NanosetError as e:
        raise ConfigError(f"data_stages[{i}] ({stage.name}).data.dataset.dataset_folder: {e}") from None


def validate_data(config: Config, stage_folders: list[list[str]] | None = None) -> DataPlan:
    """The I/O half of validation: opens every dataset folder; returns the plan for reuse."""
    return DataPlan(config, stage_folders)
