"""A stage's data section: its datasets (Nanoset folders or a Hugging Face dataset), their weights (constant, a
schedule, or decided during the run) and how they are read. The schema (``runtime.config.schema``) holds the stage
around it and names these classes too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runtime.config.ranges import NON_NEGATIVE, SEED, Range, key


@dataclass
class WeightsAtStep:
    """One entry of a weight schedule: the weights at a global step (linear to the next entry's)."""

    step: int  # a global step of the stage; the first entry is at the stage's start_training_step
    weights: list[float]  # one per folder, each ≥ 0, not all zero; normalised after interpolating


@dataclass
class AdaptiveMixingArgs:
    """Weights decided during the run, every ``every`` steps, from the per-source loss (docs/data-order.md)."""

    rule: str  # loss_proportional | odm | a user's module:function
    every: int = key()  # steps per block: the statistics of block b decide the weights of block b + 2
    initial: list[float] | None = None  # the weights of blocks 1 and 2, one per folder; default: equal
    min_weight: float = key(0.0, Range(0, 1, high_open=True))  # the floor of every decided weight
    temperature: float = key(1.0)  # loss_proportional: w ∝ loss ** temperature
    smoothing: float | None = key(None, Range(0, 1, high_open=True))  # default 0 (loss_proportional), 0.9 (odm)
    exploration: float | None = key(None, Range(0, 1))  # odm: a fixed ε; default the decaying min(1/k, √(ln k/(k·t)))


@dataclass
class AdaptiveWeights:
    adaptive: AdaptiveMixingArgs


@dataclass
class NanosetDatasetsArgs:
    # dataset folders (Nanoset, datatrove or Megatron) blended in the stage; a mapping name → folder names them
    dataset_folder: str | list[str] | dict[str, str]
    # one weight per folder (default: equal), a schedule: [{step, weights}, ...] linear in between, or
    # {adaptive: {rule, every, ...}}: decided during the run
    dataset_weights: list[float] | list[WeightsAtStep] | AdaptiveWeights | None = None

    @property
    def folders(self) -> list[str]:
        f = self.dataset_folder
        return [f] if isinstance(f, str) else list(f.values()) if isinstance(f, dict) else list(f)

    @property
    def names(self) -> list[str] | None:
        """The sources' names, in the folders' order, when ``dataset_folder`` is a mapping."""
        return list(self.dataset_folder) if isinstance(self.dataset_folder, dict) else None

    @property
    def schedule(self) -> list[WeightsAtStep] | None:
        """The weight schedule, when ``dataset_weights`` is one."""
        w = self.dataset_weights
        return list(w) if isinstance(w, list) and w and isinstance(w[0], WeightsAtStep) else None

    @property
    def adaptive(self) -> AdaptiveMixingArgs | None:
        """The adaptive mixing, when ``dataset_weights`` is one."""
        w = self.dataset_weights
        return w.adaptive if isinstance(w, AdaptiveWeights) else None

    @property
    def weights(self) -> list[float] | None:
        """Constant weights (equal by default); None for a schedule or adaptive weights."""
        if self.schedule is not None or self.adaptive is not None:
            return None
        return list(self.dataset_weights) if self.dataset_weights is not None else [1.0] * len(self.folders)


@dataclass
class HFDatasetArgs:
    hf_dataset_or_datasets: str  # a local dataset file or save_to_disk folder, tokenized once into cache_dir
    text_column_name: str = "text"
    hf_dataset_splits: str | list[str] | None = None  # splits of a saved DatasetDict; default: all
    # rows are conversations (a messages column, or prompt + completion): rendered with the chat template,
    # tokenized with loss masks (trained only on the assistant turns), as `nanoset tokenize --chat` does
    sft: bool = False
    chat_template: str | None = None  # sft: a Jinja file; default: the tokenizer's own template
    messages_column_name: str = "messages"
    prompt_column_name: str = "prompt"
    completion_column_name: str = "completion"


@dataclass
class DataArgs:
    dataset: NanosetDatasetsArgs | HFDatasetArgs  # Nanoset folders, or a Hugging Face dataset
    seed: int | None = key(None, SEED)  # the data order's seed; default: general.seed
    # default: read in a thread of the training process, 2 micro-batches ahead (README: Speed)
    num_loading_workers: int = key(0, NON_NEGATIVE)
    prefetch: int = key(2, NON_NEGATIVE)  # micro-batches read ahead by a thread of the training process (0: none)
    use_position_ids: bool = False  # position ids restart at each document; no label across a document start
    packing: Literal["window", "documents"] = "window"  # documents: whole documents per sample, padded
    drop_long_documents: bool = False  # documents packing: drop (not truncate) documents longer than L + 1
