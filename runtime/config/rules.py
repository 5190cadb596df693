"""The rules a training config must follow that need no I/O (sizes, parallel layout, stages,
validation sets); each error names the key to change. ``load_config`` applies them."""

from __future__ import annotations

import os
from dataclasses import fields

from nanoset.errors import ConfigError
from runtime.config.schema import SIZE_KEYS, Config, HFDatasetArgs, NanosetDatasetsArgs, RopeScalingArgs


def validate_config(c: Config) -> None:
    _validate_sizes(c)
    _validate_parallelism(c)
    _validate_stages(c)
    _validate_validation(c)


def _positive(value: int | float, path: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{path}: must be {'≥ 0' if allow_zero else '> 0'}, got {value}")


def _validate_sizes(c: Config) -> None:
    m, t = c.model, c.tokens
    for name in SIZE_KEYS:
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
    for name in ("dp", "tp", "pp", "cp", "pp_virtual_stages"):
        _positive(getattr(p, name), f"parallelism.{name}")
    if m.num_attention_heads % p.tp or m.kv_heads % p.tp:
        raise ConfigError(f"parallelism.tp {p.tp} must divide model.num_attention_heads {m.num_attention_heads} "
                          f"and num_key_value_heads {m.kv_heads}")
    if m.intermediate_size % p.tp:
        raise ConfigError(f"parallelism.tp {p.tp} must divide model.intermediate_size {m.intermediate_size}")
    if m.compile and p.tp > 1:  # found with torch 2.13, under inductor and aot_eager alike
        raise ConfigError(f"model.compile with parallelism.tp {p.tp} fails in torch's DTensor backward under "
                          f"torch.compile ('Tensor' object has no attribute '_local_tensor' at the first step); set "
                          f"model.compile: false, or tp: 1")
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
            raise ConfigError(f"{where}.name: stage names must be unique; {s.name!r} appears "
                              f"{names.count(s.name)} times")
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
        cp = c.parallelism.cp
        if cp > 1 and seq % (2 * cp):
            own = s.sequence_length is not None
            key = f"{where}.sequence_length" if own else f"tokens.sequence_length (of {where})"
            raise ConfigError(f"{key} {seq} is not divisible by 2 × parallelism.cp = {2 * cp}: context parallelism "
                              f"cuts each sample into 2·cp chunks, two per cp rank; use a multiple of {2 * cp} or "
                              f"another cp")
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
