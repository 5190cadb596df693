"""The training config's schema: one dataclass per section, a line on each key.

Construction does no I/O and checks nothing across keys: ``runtime.config.load`` builds a
``Config`` strictly from YAML and ``runtime.config.rules`` checks it; ``docs/config.md`` lists
every key with its default (a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from nanoset.cache import cache_root
from nanoset.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """The values a numeric key may take (``rules`` checks every key that has one, before start-up)."""

    low: float
    high: float | None = None
    low_open: bool = False  # low itself excluded
    high_open: bool = False

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        low = _number(self.low)
        if self.high is None:
            return f"{'>' if self.low_open else '≥'} {low}"
        return f"in {'(' if self.low_open else '['}{low}, {_number(self.high)}{')' if self.high_open else ']'}"


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"  # an int bound exactly (2**64 - 1, not 1.84467e+19)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
SEED = Range(0, 2**64 - 1)  # what torch.manual_seed takes


def key(default: Any = dataclasses.MISSING, valid: Range = POSITIVE) -> Any:
    """A numeric config key with its valid range."""
    return field(default=default, metadata={"range": valid})

PipelineEngine = Literal["afab", "1f1b", "interleaved-1f1b"]
PP_ENGINES: tuple[str, ...] = get_args(PipelineEngine)


@dataclass
class GeneralArgs:
    project: str  # the project's name (Nanotron's key, kept for its configs; the trainer does not use it)
    run: str  # the run's name: its folder is runs/<run> unless run_dir is given
    seed: int = key(42, SEED)  # model initialisation, and the data order of stages without data.seed
    run_dir: str | None = None  # default: runs/<run>
    cache_dir: str | None = None  # tokenized HF datasets, packings, schedule counts; null: the user's cache

    def __post_init__(self) -> None:  # `~/runs/x` is the home folder's, not a folder named `~` here
        self.run_dir = _home(self.run_dir)
        self.cache_dir = _home(self.cache_dir)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else Path("runs") / self.run)

    @property
    def cache_path(self) -> Path:
        """Where the run's derived data goes: ``cache_dir``, else the user's cache (``nanoset.cache``)."""
        return cache_root(self.cache_dir)


@dataclass
class ParallelismArgs:
    dp: int = key(1)  # data-parallel replicas (FSDP2 shards parameters over them)
    tp: int = key(1)  # tensor-parallel ranks per replica
    pp: int = key(1)  # pipeline stages
    # context-parallel ranks per replica: each sample's sequence is split over them (head-tail chunks)
    cp: int = key(1)
    pp_engine: PipelineEngine = "1f1b"  # the pipeline schedule: afab (GPipe), 1f1b or interleaved-1f1b
    pp_virtual_stages: int = key(2)  # model chunks per pipeline rank with interleaved-1f1b
    # FSDP's gradient reduce-scatter: after every micro-batch (sharded gradients between them), or only after
    # the last (full unsharded fp32 gradients kept between micro-batches: 4 bytes × every parameter per GPU)
    gradient_sync: Literal["every_micro_batch", "last_micro_batch"] = "every_micro_batch"

    @property
    def world_size(self) -> int:
        """The processes this layout needs."""
        return self.dp * self.cp * self.tp * self.pp

    def describe(self) -> str:
        cp = f" × cp {self.cp}" if self.cp > 1 else ""
        return f"tp {self.tp}{cp} × pp {self.pp} × dp {self.dp} = {self.world_size} processes"

    def check_world(self, world: int, launched: bool = True) -> None:
        """Refuse a world of another size: ``launched`` by the launcher (known before any process group),
        or found in ``WORLD_SIZE`` by a process group being made."""
        if world == self.world_size:
            return
        if launched:
            raise ConfigError(f"parallelism {self.describe()}, but {world} were launched; use torchrun "
                              f"--nproc_per_node={self.world_size}")
        raise ConfigError(f"parallelism {self.describe()}, but WORLD_SIZE is {world}; launch with torchrun "
                          f"--nproc_per_node={self.world_size} (× nodes) or change parallelism")


@dataclass
class RopeScalingArgs:
    """RoPE frequency scaling as Hugging Face configs write it: ``linear`` (positions / factor) or ``llama3``
    (Llama 3.1: long wavelengths / factor, short ones kept, a smooth ramp between)."""

    rope_type: Literal["linear", "llama3"]
    factor: float = key()
    low_freq_factor: float | None = key(None)  # llama3 only
    high_freq_factor: float | None = key(None)  # llama3 only
    original_max_position_embeddings: int | None = key(None)  # llama3 only


# the model sizes; with model.init_from_hf they may be omitted (taken from its config.json)
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
             "max_position_embeddings")
# the keys that shape the parameters (a checkpoint loads only into the same); rope_theta, rms_norm_eps,
# max_position_embeddings, init_std and dtype may change on resume (e.g. to extend the context)
SHAPE_KEYS = ("family",) + SIZE_KEYS[:5] + ("num_key_value_heads", "head_dim", "tie_word_embeddings")


@dataclass
class ModelArgs:
    # the model family (runtime/models/registry.py, docs/models.md); model.init_from_hf: its architectures' family
    family: str = "llama"
    hidden_size: int | None = key(None)  # width of the residual stream
    num_hidden_layers: int | None = key(None)  # decoder layers
    num_attention_heads: int | None = key(None)  # query heads
    intermediate_size: int | None = key(None)  # SwiGLU hidden width
    vocab_size: int | None = key(None)  # ids the embedding holds: at least the tokenizer's
    max_position_embeddings: int | None = key(None)  # the longest sequence length any stage may use
    num_key_value_heads: int | None = key(None)  # default: num_attention_heads (no grouping)
    head_dim: int | None = key(None)  # default: hidden_size // num_attention_heads
    rope_scaling: RopeScalingArgs | None = None
    # a local Hugging Face folder of a family's model: its config.json gives the family and sizes, its weights
    # start a fresh run
    init_from_hf: str | None = None
    tie_word_embeddings: bool = False  # the output head is the embedding
    rope_theta: float = key(10000.0)  # RoPE base
    rms_norm_eps: float = key(1e-5)  # RMSNorm epsilon
    init_std: float = key(0.02, NON_NEGATIVE)  # standard deviation of the seeded initialisation
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    # document: a token attends only to earlier tokens of its own document (where position_ids restart)
    attention: Literal["causal", "document"] = "causal"
    compile: bool = False  # torch.compile each decoder layer (the loss stays eager)
    # recompute layers' activations in the backward pass: every layer (full) or every Nth (selective)
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    activation_checkpointing_every: int = key(2)  # selective: layers 0, N, 2N, ... (global indices)
    # rotate queries and keys in fp32 (torchtitan's choice, for stages of 32k tokens and more); false: in the
    # compute dtype, as Hugging Face does, so that exports agree
    rope_fp32: bool = False

    def __post_init__(self) -> None:
        self.init_from_hf = _home(self.init_from_hf)

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


@dataclass
class TokensArgs:
    sequence_length: int = key()  # tokens per sample (a stage may set its own)
    micro_batch_size: int = key()  # samples per rank and forward pass
    train_steps: int = key(valid=NON_NEGATIVE)  # optimizer steps of the whole run (0: load, save, export)
    # micro-batches per step and replica (the pipeline's micro-batches)
    batch_accumulation_per_replica: int = key(1)


@dataclass
class OptimizerArgs:
    learning_rate: float = key()  # the peak learning rate of AdamW
    weight_decay: float = key(0.0, NON_NEGATIVE)  # decoupled weight decay of matrices (norms and biases: none)
    clip_grad: float | None = key(1.0)  # clip the global gradient norm to this; null: no clipping
    adam_beta1: float = key(0.9, Range(0, 1, high_open=True))
    adam_beta2: float = key(0.95, Range(0, 1, high_open=True))
    adam_eps: float = key(1e-8, NON_NEGATIVE)
    # consecutive steps skipped (no update: their loss or gradient norm is not finite) before the run stops
    max_skipped_steps: int = key(10, NON_NEGATIVE)


@dataclass
class LRSchedulerArgs:
    warmup_steps: int = key(0, NON_NEGATIVE)  # linear warm-up from 0 to the peak
    decay_style: Literal["cosine", "linear", "constant", "wsd"] = "cosine"  # decay to min_lr at the last step
    min_lr: float = key(0.0, NON_NEGATIVE)  # the learning rate at the last step
    # wsd: share of the steps after warm-up spent decaying
    wsd_decay_fraction: float = key(0.2, Range(0, 1, low_open=True))


@dataclass
class StageOptimizerArgs:
    """A stage's own optimizer: each key it does not give (null) is the top-level ``optimizer``'s."""

    learning_rate: float | None = key(None)  # given: the stage has its own schedule (from its first step)
    weight_decay: float | None = key(None, NON_NEGATIVE)
    clip_grad: float | None = key(None)  # null: the top level's (a stage cannot turn clipping off)
    adam_beta1: float | None = key(None, Range(0, 1, high_open=True))
    adam_beta2: float | None = key(None, Range(0, 1, high_open=True))
    adam_eps: float | None = key(None, NON_NEGATIVE)
    max_skipped_steps: int | None = key(None, NON_NEGATIVE)
    reset_state: bool = False  # AdamW's moments and step count start fresh at the stage's first step


@dataclass
class StageLRSchedulerArgs:
    """A stage's own learning-rate schedule, counted from the stage's first step to its last; each key it does not
    give (null) is the top-level ``lr_scheduler``'s."""

    warmup_steps: int | None = key(None, NON_NEGATIVE)
    decay_style: Literal["cosine", "linear", "constant", "wsd"] | None = None
    min_lr: float | None = key(None, NON_NEGATIVE)
    wsd_decay_fraction: float | None = key(None, Range(0, 1, low_open=True))


def merged_section(top: Any, stage: Any) -> Any:
    """``top`` (a top-level section) with every key that ``stage`` (the stage's section, or None) gives."""
    if stage is None:
        return top
    given = {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage)
             if f.name in {g.name for g in dataclasses.fields(top)} and getattr(stage, f.name) is not None}
    return dataclasses.replace(top, **given)


@dataclass
class CheckpointsArgs:
    checkpoint_interval: int = key(0, NON_NEGATIVE)  # 0: only at the end
    save_final: bool = True  # a checkpoint after the last step
    resume: str | None = "latest"  # latest | PATH | null
    keep_last: int = key(3)  # checkpoints kept (the newest by step number)
    checkpoints_path: str | None = None  # default: <run_dir>/checkpoints
    # resume although the data of a stage that has begun (datasets, content, weights, seed) or the global batch
    # size mid-stage changed: finished stages keep the checkpoint's record, the current one changes from the resume
    allow_data_change: bool = False
    replace_run: bool = False  # starting fresh where a run exists: move the old one to <run_dir>.old-<time>
    export_hf: bool = False  # at the end of training: the final checkpoint as a Hugging Face folder, <run_dir>/hf
    # write checkpoints in the background: the loop waits only while the state is copied to host memory; null: on
    # for CUDA, off on CPU
    async_save: bool | None = None

    def __post_init__(self) -> None:
        self.checkpoints_path = _home(self.checkpoints_path)
        self.resume = _home(self.resume)


def _home(path: str | None) -> str | None:
    """``~`` and ``~user`` expanded in a path-valued key (YAML leaves them to the program)."""
    return os.path.expanduser(path) if path is not None else None


WandbMode = Literal["online", "offline", "disabled"]


@dataclass
class WandbArgs:
    """Weights & Biases (the ``wandb`` extra): rank 0 logs every metrics.jsonl row (runtime/observe/wandb_logger.py)."""

    project: str  # the W&B project
    entity: str | None = None  # the team or user; default: the API key's own
    name: str | None = None  # the run's display name; default: general.run
    tags: list[str] = field(default_factory=list)
    mode: WandbMode = "online"  # offline: files under dir only (`wandb sync` uploads them); disabled: nothing
    dir: str | None = None  # where W&B writes its files (a `wandb` folder in it); default: the run folder

    def __post_init__(self) -> None:
        self.dir = _home(self.dir)


@dataclass
class LoggingArgs:
    log_interval: int = key(1)  # a console line every N steps (metrics.jsonl gets every step)
    tensorboard: bool = True  # write TensorBoard events when the package is installed
    wandb: WandbArgs | None = None  # Weights & Biases; null: off


@dataclass
class TokenizerArgs:
    tokenizer_name_or_path: str  # for Hugging Face dataset stages: the tokenizer that tokenizes them
    eos_token: str | None = None  # the EOS appended to every document; default: the tokenizer's own


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


@dataclass
class DatasetStageArgs:
    name: str  # unique; a checkpoint's record names its stages
    start_training_step: int = key()  # the stage's first global step (one stage starts at 1)
    data: DataArgs
    sequence_length: int | None = key(None)  # default: tokens.sequence_length
    optimizer: StageOptimizerArgs | None = None  # the stage's own optimizer keys; null: the top level's
    lr_scheduler: StageLRSchedulerArgs | None = None  # the stage's own schedule; null: the run's (see own_schedule)

    @property
    def own_schedule(self) -> bool:
        """Whether the stage has its own learning-rate schedule, counted from its first step: it gives
        ``lr_scheduler`` or ``optimizer.learning_rate``; otherwise it takes the run's schedule at its steps."""
        return self.lr_scheduler is not None or (self.optimizer is not None and
                                                 self.optimizer.learning_rate is not None)


@dataclass
class ValidationArgs:
    """Held-out loss during training: a fixed sample set per named dataset, never drawn from the training order."""

    datasets: dict[str, str | list[str]] = field(default_factory=dict)  # name → folder or folders
    interval: int = key(0, NON_NEGATIVE)  # evaluate every N steps; 0: only at stage ends (at_stage_end)
    samples: int = key(64)  # windows per dataset: the first `samples` of the dataset's seeded permutation
    at_stage_end: bool = True  # also evaluate at the last step of every stage
    seed: int | None = key(None, SEED)  # default: general.seed
    sequence_length: int | None = key(None)  # every validation of the run at this length; null: the first stage's
    holdout: float = key(0.0, Range(0, 1, high_open=True))  # this fraction of each training folder's documents never
    # trains and is the validation set <source>-holdout

    def folders(self, name: str) -> list[str]:
        value = self.datasets[name]
        return [value] if isinstance(value, str) else list(value)

    @property
    def enabled(self) -> bool:
        return bool(self.datasets or self.holdout) and (self.interval > 0 or self.at_stage_end)


@dataclass
class EvaluationTaskArgs:
    """A multiple-choice task: a JSON-lines file of ``{"context", "choices", "gold"}`` rows (docs/evaluation.md)."""

    name: str  # its key in the metrics row's ``eval``
    path: str  # the JSON-lines file


@dataclass
class EvaluationArgs:
    """Evaluation during training: multiple-choice tasks scored by log-likelihood, and the user's hooks."""

    interval: int = key(0, NON_NEGATIVE)  # evaluate every N steps; 0: never during training
    tasks: list[EvaluationTaskArgs] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # "module:function", called with the model and step


@dataclass
class SpikeArgs:
    """A step whose loss exceeds the mean of the last ``window`` trained steps of its stage by ``zscore`` standard
    deviations is a spike: logged to <run_dir>/spikes.jsonl with its samples, ranked by loss."""

    zscore: float = key(6.0)
    window: int = key(100, Range(2))  # trained steps of the current stage a step is judged against
    action: Literal["log", "skip"] = "log"  # skip: no update either (it counts toward optimizer.max_skipped_steps)


@dataclass
class SurgeryArgs:
    """Data surgery: steps read but not trained, documents excised from a step on (docs/data-order.md), and spikes
    found and logged (or skipped)."""

    skip_steps: list[str] = field(default_factory=list)  # "A:B" ranges (both included): read, not trained
    exclude_documents: list[str] = field(default_factory=list)  # FOLDER:DOC: no trained sample holds a token of it
    exclude_documents_file: str | None = None  # a file of FOLDER:DOC lines, excluded as exclude_documents
    exclude_from_step: int = key(1)  # the first step the exclusions apply to
    spike: SpikeArgs | None = None  # null: no spike detection


@dataclass
class StorageArgs:
    """The local cache of datasets read from object storage (``s3://``, ``gs://``): docs/storage.md."""

    cache_dir: str | None = None  # null: remote/ under the user's cache (nanoset.cache); use a node-local disk
    cache_limit_gb: float | None = key(None)  # null: no limit; least recently used shards go first beyond it

    def __post_init__(self) -> None:
        self.cache_dir = _home(self.cache_dir)


@dataclass
class Config:
    general: GeneralArgs
    model: ModelArgs
    tokens: TokensArgs
    optimizer: OptimizerArgs
    data_stages: list[DatasetStageArgs]
    parallelism: ParallelismArgs = field(default_factory=ParallelismArgs)
    lr_scheduler: LRSchedulerArgs = field(default_factory=LRSchedulerArgs)
    checkpoints: CheckpointsArgs = field(default_factory=CheckpointsArgs)
    logging: LoggingArgs = field(default_factory=LoggingArgs)
    tokenizer: TokenizerArgs | None = None
    validation: ValidationArgs = field(default_factory=ValidationArgs)
    evaluation: EvaluationArgs = field(default_factory=EvaluationArgs)
    surgery: SurgeryArgs = field(default_factory=SurgeryArgs)
    storage: StorageArgs = field(default_factory=StorageArgs)
    # not a key: ``--config PATH --set K=V …`` as ``read_config`` loaded it, which the commands the runtime
    # suggests repeat (``suggested_command``); a config built in a program has no file to name
    arguments: ClassVar[tuple[str, ...]] = ("--config", "CONFIG")

    def to_dict(self) -> dict:
        return to_dict(self)

    @property
    def world_size(self) -> int:
        return self.parallelism.world_size

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: dp · micro_batch_size · batch_accumulation_per_replica."""
        t = self.tokens
        return self.parallelism.dp * t.micro_batch_size * t.batch_accumulation_per_replica

    def stage_sequence_length(self, stage: DatasetStageArgs) -> int:
        return stage.sequence_length if stage.sequence_length is not None else self.tokens.sequence_length

    @property
    def validation_sequence_length(self) -> int:
        """The one sequence length of every validation and evaluation of the run (a series stays comparable across
        stages of other lengths): ``validation.sequence_length``, default the first stage's."""
        v = self.validation.sequence_length
        return v if v is not None else self.stage_sequence_length(self.data_stages[0])

    def stage_end_step(self, stage: DatasetStageArgs) -> int:
        """First global step after ``stage`` (exclusive end): the next stage's start, or train_steps + 1."""
        later = [s.start_training_step for s in self.data_stages if s.start_training_step > stage.start_training_step]
        return min(later) if later else self.tokens.train_steps + 1

    def stage_optimizer(self, stage: DatasetStageArgs) -> OptimizerArgs:
        """The optimizer keys in force in ``stage``: its own, and the top level's for the rest."""
        return merged_section(self.optimizer, stage.optimizer)

    def stage_lr_scheduler(self, stage: DatasetStageArgs) -> LRSchedulerArgs:
        """The schedule keys of ``stage``: its own, and the top level's for the rest."""
        return merged_section(self.lr_scheduler, stage.lr_scheduler)

    def stage_seed(self, stage: DatasetStageArgs) -> int:
        return stage.data.seed if stage.data.seed is not None else self.general.seed

    def stage_at(self, step: int) -> DatasetStageArgs:
        """The stage that global step ``step`` (1-based) belongs to."""
        if not 1 <= step <= self.tokens.train_steps:
            raise ConfigError(f"step {step} is outside [1, tokens.train_steps={self.tokens.train_steps}]")
        return max((s for s in self.data_stages if s.start_training_step <= step), key=lambda s: s.start_training_step)


def to_dict(obj: Any) -> Any:
    """A config (or any part of it) as plain data, ready for YAML or JSON: the inverse of ``load.from_dict``."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    return obj
