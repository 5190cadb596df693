"""Training configuration: dataclasses loaded strictly from YAML, validated before any process starts.

``Config.from_yaml(path)`` parses and checks every rule that needs no I/O;
``validate_data(config)`` then opens the dataset folders (cheap: manifests and ``stat``) and
checks what needs the data: folders exist, one tokenizer, vocab sizes, enough tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, Union

import yaml

from runtime.config_loading import ConfigError, from_dict, to_dict

PP_ENGINES = ("afab", "1f1b", "interleaved-1f1b")


@dataclass
class GeneralArgs:
    project: str
    run: str
    seed: int = 42
    run_dir: str | None = None  # default: runs/<run>
    cache_dir: str = ".nanoset_cache"  # where Hugging Face datasets are tokenized once

    def __post_init__(self) -> None:  # `~/runs/x` is the home folder's, not a folder named `~` here
        self.run_dir = _home(self.run_dir)
        self.cache_dir = _home(self.cache_dir)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else Path("runs") / self.run)


@dataclass
class ParallelismArgs:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    pp_engine: Literal["afab", "1f1b", "interleaved-1f1b"] = "1f1b"
    pp_virtual_stages: int = 2  # model chunks per pipeline rank with interleaved-1f1b


@dataclass
class RopeScalingArgs:
    """RoPE frequency scaling as Hugging Face configs write it: ``linear`` (positions / factor) or ``llama3``
    (Llama 3.1: long wavelengths / factor, short ones kept, a smooth ramp between)."""

    rope_type: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float | None = None  # llama3 only
    high_freq_factor: float | None = None  # llama3 only
    original_max_position_embeddings: int | None = None  # llama3 only


# the model sizes; with model.init_from_hf they may be omitted (taken from its config.json)
MODEL_SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                   "max_position_embeddings")


@dataclass
class ModelArgs:
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    num_key_value_heads: int | None = None  # default: num_attention_heads (no grouping)
    head_dim: int | None = None  # default: hidden_size // num_attention_heads
    rope_scaling: RopeScalingArgs | None = None
    # a local Hugging Face Llama folder: its config.json gives the sizes, its weights start a fresh run
    init_from_hf: str | None = None
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    init_std: float = 0.02
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    # document: a token attends only to earlier tokens of its own document (where position_ids restart)
    attention: Literal["causal", "document"] = "causal"
    compile: bool = False  # torch.compile each decoder layer (the loss stays eager)
    # recompute layers' activations in the backward pass: every layer (full) or every Nth (selective)
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    activation_checkpointing_every: int = 2  # selective: layers 0, N, 2N, ... (global indices)

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
    sequence_length: int
    micro_batch_size: int
    train_steps: int
    batch_accumulation_per_replica: int = 1


@dataclass
class OptimizerArgs:
    learning_rate: float
    weight_decay: float = 0.0
    clip_grad: float | None = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8


@dataclass
class LRSchedulerArgs:
    warmup_steps: int = 0
    decay_style: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    min_lr: float = 0.0
    wsd_decay_fraction: float = 0.2  # wsd: share of the steps after warm-up spent decaying


@dataclass
class CheckpointsArgs:
    checkpoint_interval: int = 0  # 0: only at the end
    save_final: bool = True  # a checkpoint after the last step
    resume: str | None = "latest"  # latest | PATH | null
    keep_last: int = 3
    checkpoints_path: str | None = None  # default: <run_dir>/checkpoints
    # resume although the data of a stage that has begun (datasets, content, weights, seed) or the global batch
    # size mid-stage changed: finished stages keep the checkpoint's record, the current one changes from the resume
    allow_data_change: bool = False
    replace_run: bool = False  # starting fresh where a run exists: move the old one to <run_dir>.old-<time>
    export_hf: bool = False  # at the end of training: the final checkpoint as a Hugging Face folder, <run_dir>/hf

    def __post_init__(self) -> None:
        self.checkpoints_path = _home(self.checkpoints_path)
        self.resume = _home(self.resume)


def _home(path: str | None) -> str | None:
    """``~`` and ``~user`` expanded in a path-valued key (YAML leaves them to the program)."""
    return os.path.expanduser(path) if path is not None else None


@dataclass
class LoggingArgs:
    log_interval: int = 1
    tensorboard: bool = True  # write TensorBoard events when the package is installed


@dataclass
class TokenizerArgs:
    tokenizer_name_or_path: str
    eos_token: str | None = None


@dataclass
class NanosetDatasetsArgs:
    dataset_folder: Union[str, list[str]]
    dataset_weights: list[float] | None = None

    @property
    def folders(self) -> list[str]:
        return [self.dataset_folder] if isinstance(self.dataset_folder, str) else list(self.dataset_folder)

    @property
    def weights(self) -> list[float]:
        return list(self.dataset_weights) if self.dataset_weights is not None else [1.0] * len(self.folders)


@dataclass
class HFDatasetArgs:
    hf_dataset_or_datasets: str
    text_column_name: str = "text"
    hf_dataset_splits: Union[str, list[str], None] = None
    # rows are conversations (a messages column, or prompt + completion): rendered with the chat template,
    # tokenized with loss masks (trained only on the assistant turns), as `nanoset tokenize --chat` does
    sft: bool = False
    chat_template: str | None = None  # sft: a Jinja file; default: the tokenizer's own template
    messages_column_name: str = "messages"
    prompt_column_name: str = "prompt"
    completion_column_name: str = "completion"


@dataclass
class DataArgs:
    dataset: Union[NanosetDatasetsArgs, HFDatasetArgs]
    seed: int | None = None  # default: general.seed
    # default: read in a thread of the training process, 2 micro-batches ahead (README: Speed)
    num_loading_workers: int = 0
    prefetch: int = 2  # micro-batches read ahead by a thread of the training process (0: none)
    use_position_ids: bool = False
    packing: Literal["window", "documents"] = "window"  # documents: whole documents per sample, padded
    drop_long_documents: bool = False  # documents packing: drop (not truncate) documents longer than L + 1


@dataclass
class DatasetStageArgs:
    name: str
    start_training_step: int
    data: DataArgs
    sequence_length: int | None = None  # default: tokens.sequence_length


@dataclass
class ValidationArgs:
    """Held-out loss during training: a fixed sample set per named dataset, never drawn from the training order."""

    datasets: dict[str, Union[str, list[str]]] = field(default_factory=dict)  # name → folder or folders
    interval: int = 0  # evaluate every N steps; 0: only at stage ends (at_stage_end)
    samples: int = 64  # windows per dataset: the first `samples` of the dataset's seeded permutation
    at_stage_end: bool = True  # also evaluate at the last step of every stage
    seed: int | None = None  # default: general.seed

    def folders(self, name: str) -> list[str]:
        value = self.datasets[name]
        return [value] if isinstance(value, str) else list(value)

    @property
    def enabled(self) -> bool:
        return bool(self.datasets) and (self.interval > 0 or self.at_stage_end)


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

    @staticmethod
    def from_yaml(path: str | Path) -> Config:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
        try:
            config = from_dict(Config, data, "config")
            if config.model.init_from_hf is not None:
                from runtime.hf.config_map import apply_hf_config

                apply_hf_config(config.model, given=set(data["model"]))
            config.validate()
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        return config

    def to_dict(self) -> dict:
        return to_dict(self)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: dp · micro_batch_size · batch_accumulation_per_replica."""
        t = self.tokens
        return self.parallelism.dp * t.micro_batch_size * t.batch_accumulation_per_replica

    def stage_sequence_length(self, stage: DatasetStageArgs) -> int:
        return stage.sequence_length if stage.sequence_length is not None else self.tokens.sequence_length

    def stage_end_step(self, stage: DatasetStageArgs) -> int:
        """First global step after ``stage`` (exclusive end): the next stage's start, or train_steps + 1."""
        later = [s.start_training_step for s in self.data_stages if s.start_training_step > stage.start_training_step]
        return min(later) if later else self.tokens.train_steps + 1

    def stage_seed(self, stage: DatasetStageArgs) -> int:
        return stage.data.seed if stage.data.seed is not None else self.general.seed

    def validate(self) -> None:
        """Every rule that needs no I/O; each error says which key to change."""
        _validate_sizes(self)
        _validate_parallelism(self)
        _validate_stages(self)
        _validate_validation(self)


def _positive(value: int | float, path: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{path}: must be {'≥ 0' if allow_zero else '> 0'}, got {value}")


def _validate_sizes(c: Config) -> None:
    m, t = c.model, c.tokens
    for name in MODEL_SIZE_KEYS:
        if getattr(m, name) is None:
            raise ConfigError(f"config.model.{name}: required key is missing (give it, or model.init_from_hf: PATH "
                              f"of a Hugging Face model whose config.json has it)")
        _positive(getattr(m, name), f"model.{name}")
    for name in ("sequence_length", "micro_batch_size", "train_steps", "batch_accumulation_per_replica"):
        _positive(getattr(t, name), f"tokens.{name}")
    _positive(m.activation_checkpointing_every, "model.activation_checkpointing_every")
    if m.head_dim is not None:
        _positive(m.head_dim, "model.head_dim")
    elif m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"model.hidden_size {m.hidden_size} is not divisible by num_attention_heads "
                          f"{m.num_attention_heads}; give model.head_dim")
    if m.num_attention_heads % m.kv_heads:
        raise ConfigError(f"model.num_attention_heads {m.num_attention_heads} is not divisible by "
                          f"num_key_value_heads {m.kv_heads}")
    if m.head_size % 2:
        raise ConfigError(f"model: head size {m.head_size} must be even for RoPE")
    _validate_rope_scaling(m.rope_scaling)
    if t.sequence_length > m.max_position_embeddings:
        raise ConfigError(f"tokens.sequence_length {t.sequence_length} > model.max_position_embeddings "
                          f"{m.max_position_embeddings}; lower one or raise the other")
    _positive(c.optimizer.learning_rate, "optimizer.learning_rate")
    _positive(c.optimizer.weight_decay, "optimizer.weight_decay", allow_zero=True)
    s = c.lr_scheduler
    _positive(s.warmup_steps, "lr_scheduler.warmup_steps", allow_zero=True)
    if s.min_lr > c.optimizer.learning_rate:
        raise ConfigError(f"lr_scheduler.min_lr {s.min_lr} > optimizer.learning_rate {c.optimizer.learning_rate}")
    if not 0 < s.wsd_decay_fraction <= 1:
        raise ConfigError(f"lr_scheduler.wsd_decay_fraction must be in (0, 1], got {s.wsd_decay_fraction}")
    _positive(c.checkpoints.checkpoint_interval, "checkpoints.checkpoint_interval", allow_zero=True)
    _positive(c.checkpoints.keep_last, "checkpoints.keep_last")
    if c.checkpoints.export_hf and not c.checkpoints.save_final:
        raise ConfigError("checkpoints.export_hf: exports the final checkpoint, but checkpoints.save_final is false; "
                          "set save_final: true or export a checkpoint with python -m runtime.export")
    _positive(c.logging.log_interval, "logging.log_interval")


def _validate_rope_scaling(r: RopeScalingArgs | None) -> None:
    if r is None:
        return
    _positive(r.factor, "model.rope_scaling.factor")
    llama3 = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for name in llama3:
        value = getattr(r, name)
        if r.rope_type == "llama3" and value is None:
            raise ConfigError(f"model.rope_scaling.{name}: required with rope_type llama3")
        if r.rope_type == "linear" and value is not None:
            raise ConfigError(f"model.rope_scaling.{name}: only applies to rope_type llama3; remove it")
        if value is not None:
            _positive(value, f"model.rope_scaling.{name}")
    if r.rope_type == "llama3" and r.high_freq_factor <= r.low_freq_factor:
        raise ConfigError(f"model.rope_scaling: high_freq_factor {r.high_freq_factor} must be > low_freq_factor "
                          f"{r.low_freq_factor}")


def _validate_parallelism(c: Config) -> None:
    p, m = c.parallelism, c.model
    for name in ("dp", "tp", "pp", "pp_virtual_stages"):
        _positive(getattr(p, name), f"parallelism.{name}")
    if m.num_attention_heads % p.tp or m.kv_heads % p.tp:
        raise ConfigError(f"parallelism.tp {p.tp} must divide model.num_attention_heads {m.num_attention_heads} "
                          f"and num_key_value_heads {m.kv_heads}")
    if m.intermediate_size % p.tp:
        raise ConfigError(f"parallelism.tp {p.tp} must divide model.intermediate_size {m.intermediate_size}")
    if m.tie_word_embeddings and p.pp > 1:
        raise ConfigError(f"model.tie_word_embeddings needs parallelism.pp = 1 (a tied embedding cannot be split "
                          f"across pipeline stages), got pp {p.pp}; untie it or use tp/dp instead of pp")
    interleaved = p.pp > 1 and p.pp_engine == "interleaved-1f1b"  # with pp = 1 the engine is irrelevant
    chunks = p.pp * (p.pp_virtual_stages if interleaved else 1)
    if m.num_hidden_layers < chunks:
        raise ConfigError(f"model.num_hidden_layers {m.num_hidden_layers} < {chunks} pipeline stages "
                          f"(parallelism.pp {p.pp}" + (f" × pp_virtual_stages {p.pp_virtual_stages})"
                                                       if interleaved else ")"))
    if p.pp > 1 and p.pp_engine != "afab" and c.tokens.batch_accumulation_per_replica < p.pp:
        raise ConfigError(f"tokens.batch_accumulation_per_replica {c.tokens.batch_accumulation_per_replica} "
                          f"< parallelism.pp {p.pp}: {p.pp_engine} needs at least one micro-batch per stage "
                          f"(raise it, or use pp_engine: afab)")
    if p.pp_engine == "interleaved-1f1b" and c.tokens.batch_accumulation_per_replica % p.pp:
        raise ConfigError(f"tokens.batch_accumulation_per_replica {c.tokens.batch_accumulation_per_replica} "
                          f"must be a multiple of parallelism.pp {p.pp} for interleaved-1f1b")


def _validate_stages(c: Config) -> None:
    stages = c.data_stages
    if not stages:
        raise ConfigError("data_stages: at least one stage is needed")
    names = [s.name for s in stages]
    starts = [s.start_training_step for s in stages]
    for i, s in enumerate(stages):
        where = f"data_stages[{i}] ({s.name})"
        if names.count(s.name) > 1:
            raise ConfigError(f"{where}.name: stage names must be unique; {s.name!r} appears {names.count(s.name)} times")
        if starts.count(s.start_training_step) > 1:
            raise ConfigError(f"{where}.start_training_step: {s.start_training_step} is used by several stages; "
                              f"each stage needs its own start step")
        if s.start_training_step < 1 or s.start_training_step > c.tokens.train_steps:
            raise ConfigError(f"{where}.start_training_step: {s.start_training_step} is outside [1, "
                              f"tokens.train_steps={c.tokens.train_steps}]")
        seq = c.stage_sequence_length(s)
        _positive(seq, f"{where}.sequence_length")
        if seq > c.model.max_position_embeddings:
            raise ConfigError(f"{where}.sequence_length {seq} > model.max_position_embeddings "
                              f"{c.model.max_position_embeddings}")
        _positive(s.data.num_loading_workers, f"{where}.data.num_loading_workers", allow_zero=True)
        _positive(s.data.prefetch, f"{where}.data.prefetch", allow_zero=True)
        if c.model.attention == "document" and not s.data.use_position_ids:
            raise ConfigError(f"{where}.data.use_position_ids: model.attention: document finds document boundaries "
                              f"where position ids restart; set use_position_ids: true in every stage")
        if s.data.drop_long_documents and s.data.packing != "documents":
            raise ConfigError(f"{where}.data.drop_long_documents: only applies with packing: documents (packing is "
                              f"{s.data.packing!r}); remove it or set packing: documents")
        ds = s.data.dataset
        if isinstance(ds, NanosetDatasetsArgs):
            if not ds.folders:
                raise ConfigError(f"{where}.data.dataset.dataset_folder: give at least one folder")
            if len(ds.weights) != len(ds.folders):
                raise ConfigError(f"{where}.data.dataset.dataset_weights: {len(ds.weights)} weights for "
                                  f"{len(ds.folders)} folders; give one weight per folder")
            if any(not w > 0 for w in ds.weights):
                raise ConfigError(f"{where}.data.dataset.dataset_weights: weights must be positive, got {ds.weights}")
            first: dict[str, int] = {}
            for k, folder in enumerate(ds.folders):
                j = first.setdefault(os.path.normpath(os.path.abspath(folder)), k)  # A, ./A and /abs/A are one
                if j != k:
                    raise ConfigError(f"{where}.data.dataset.dataset_folder: {ds.folders[j]!r} and {folder!r} are "
                                      f"the same folder; list it once and merge the weights")
        elif c.tokenizer is None:
            raise ConfigError(f"{where}.data.dataset.hf_dataset_or_datasets needs a top-level "
                              f"tokenizer: {{tokenizer_name_or_path: ...}} to tokenize it")
        elif ds.chat_template is not None and not ds.sft:
            raise ConfigError(f"{where}.data.dataset.chat_template: only applies to conversations; set sft: true "
                              f"or remove it")
        else:
            _check_column_keys(ds, f"{where}.data.dataset")
    if 1 not in starts:
        raise ConfigError("data_stages: one stage must start at step 1 (start_training_step: 1)")
    if starts != sorted(starts):
        raise ConfigError(f"data_stages: stages must be listed in order of start_training_step, got {starts}")


def _check_column_keys(ds: HFDatasetArgs, where: str) -> None:
    """A column key of the other kind of rows would be ignored: text for conversations, or the reverse."""
    chat = {k: getattr(ds, k) for k in ("messages_column_name", "prompt_column_name", "completion_column_name")}
    defaults = {f.name: f.default for f in fields(HFDatasetArgs)}
    if ds.sft and ds.text_column_name != defaults["text_column_name"]:
        raise ConfigError(f"{where}.text_column_name: not read with sft: true (conversations come from "
                          f"messages_column_name, or prompt_column_name and completion_column_name); remove it")
    changed = [k for k, v in chat.items() if v != defaults[k]]
    if changed and not ds.sft:
        raise ConfigError(f"{where}.{changed[0]}: only applies to conversations; set sft: true or remove it")


def _validate_validation(c: Config) -> None:
    v = c.validation
    _positive(v.interval, "validation.interval", allow_zero=True)
    if not v.datasets:
        if v.interval > 0:
            raise ConfigError(f"validation.interval is {v.interval} but validation.datasets is empty; name at least "
                              f"one dataset (name: folder) or set interval: 0")
        return
    _positive(v.samples, "validation.samples")
    for name in v.datasets:
        folders = v.folders(name)
        if not name or not folders or any(not f for f in folders):
            raise ConfigError(f"validation.datasets.{name}: give a dataset name and at least one folder")
        seen = {os.path.normpath(os.path.abspath(f)) for f in folders}
        if len(seen) != len(folders):
            raise ConfigError(f"validation.datasets.{name}: a folder is listed twice in {folders}; list it once")


def get_config_from_yaml(path: str | Path) -> Config:
    """Seed-compatible alias of ``Config.from_yaml``."""
    return Config.from_yaml(path)
