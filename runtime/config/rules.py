"""The rules a training config must follow that need no I/O (sizes, parallel layout, stages,
validation sets); each error names the key to change. ``load_config`` applies them."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import fields
from typing import Any

from nanoset.errors import ConfigError
from runtime.config.parsers import check_rule, parse_document, parse_step_range
from runtime.config.schema import (
    SIZE_KEYS,
    AdaptiveMixingArgs,
    Config,
    DatasetStageArgs,
    HFDatasetArgs,
    ModelArgs,
    NanosetDatasetsArgs,
    RopeScalingArgs,
    WeightsAtStep,
)
from runtime.models.registry import model_spec


def validate_config(c: Config) -> None:
    for name in SIZE_KEYS:
        if getattr(c.model, name) is None:
            raise ConfigError(f"model.{name}: required key is missing (give it, or model.init_from_hf: PATH "
                              f"of a Hugging Face model whose config.json has it)")
    _check_ranges(c, "")
    _validate_family(c)
    _validate_sizes(c)
    _validate_parallelism(c)
    _validate_stages(c)
    _validate_validation(c)
    _validate_evaluation(c)
    _validate_surgery(c)
    _validate_wandb(c)


def _validate_family(c: Config) -> None:
    """A known ``model.family``, and no feature its model does not take (its spec's ``support``)."""
    spec = model_spec(c.model.family)
    support = spec.support
    asked = [("parallelism.cp > 1", c.parallelism.cp > 1, support.context_parallel),
             ("model.attention: document", c.model.attention == "document", support.document_masks),
             ("model.tie_word_embeddings: true", c.model.tie_word_embeddings, support.tied_embeddings)]
    for what, wanted, supported in asked:
        if wanted and not supported:
            raise ConfigError(f"{what}: model.family {spec.name}'s model does not support it (docs/models.md)")


def _check_ranges(section: Any, path: str) -> None:
    """Every numeric key within the range its schema gives it (a NaN or infinity is never within one)."""
    for f in fields(section):
        value = getattr(section, f.name)
        where = f"{path}.{f.name}" if path else f.name
        valid = f.metadata.get("range")
        if valid is not None and value is not None and not valid.allows(value):
            raise ConfigError(f"{where}: must be {valid}, got {value}")
        if dataclasses.is_dataclass(value):
            _check_ranges(value, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    label = f" ({item.name})" if isinstance(getattr(item, "name", None), str) else ""
                    _check_ranges(item, f"{where}[{i}]{label}")


def _validate_sizes(c: Config) -> None:
    m, t, tp = c.model, c.tokens, c.parallelism.tp
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"model.hidden_size {m.hidden_size} is not divisible by num_attention_heads "
                          f"{m.num_attention_heads}{_heads_hint(m, tp)}")
    if m.num_attention_heads % m.kv_heads:
        fits = [k for k in range(1, m.num_attention_heads + 1) if m.num_attention_heads % k == 0 and k % tp == 0]
        raise ConfigError(f"model.num_attention_heads {m.num_attention_heads} is not divisible by "
                          f"num_key_value_heads {m.kv_heads}; give num_key_value_heads a divisor of it "
                          f"({', '.join(map(str, fits))})")
    if m.head_dim is not None and m.head_dim % 2:
        raise ConfigError(f"model.head_dim {m.head_dim} must be even for RoPE (each rotation turns a pair of "
                          f"dimensions); use {m.head_dim - 1} or {m.head_dim + 1}")
    if m.head_size % 2:
        raise ConfigError(f"model: head size {m.head_size} (hidden_size {m.hidden_size} / num_attention_heads "
                          f"{m.num_attention_heads}) must be even for RoPE{_heads_hint(m, tp)}")
    _validate_rope_scaling(m.rope_scaling)
    if t.sequence_length > m.max_position_embeddings:
        raise ConfigError(f"tokens.sequence_length {t.sequence_length} > model.max_position_embeddings "
                          f"{m.max_position_embeddings}; lower one or raise the other")
    s = c.lr_scheduler
    if s.min_lr > c.optimizer.learning_rate:
        raise ConfigError(f"lr_scheduler.min_lr {s.min_lr} > optimizer.learning_rate {c.optimizer.learning_rate}")
    if s.warmup_steps > t.train_steps:
        raise ConfigError(f"lr_scheduler.warmup_steps {s.warmup_steps} > tokens.train_steps {t.train_steps}: the "
                          f"learning rate would never reach its peak; lower warmup_steps")
    if c.checkpoints.export_hf and not c.checkpoints.save_final:
        raise ConfigError("checkpoints.export_hf: exports the final checkpoint, but checkpoints.save_final is false; "
                          "set save_final: true or export a checkpoint with python -m runtime.export")


def _heads_hint(m: ModelArgs, tp: int) -> str:
    """The nearest head counts below and above ``num_attention_heads`` that split ``hidden_size`` into even head
    sizes (RoPE), that the key/value heads (when given) and ``tp`` divide: the usual fix of a size that does not
    split, as "; use 4 or 6 heads (head size 24 or 16)" ("" when there is none)."""
    def fits(k: int) -> bool:
        return (m.hidden_size % k == 0 and m.hidden_size // k % 2 == 0 and k % tp == 0
                and (m.num_key_value_heads is None or k % m.num_key_value_heads == 0))

    n = m.num_attention_heads
    near = [k for k in (next((k for k in range(n - 1, 0, -1) if fits(k)), None),
                        next((k for k in range(n + 1, m.hidden_size // 2 + 1) if fits(k)), None)) if k is not None]
    if not near:
        return ""
    return (f"; use {' or '.join(map(str, near))} heads (head size "
            f"{' or '.join(str(m.hidden_size // k) for k in near)})")


def _validate_rope_scaling(r: RopeScalingArgs | None) -> None:
    if r is None:
        return
    llama3 = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for name in llama3:
        value = getattr(r, name)
        if r.rope_type == "llama3" and value is None:
            raise ConfigError(f"model.rope_scaling.{name}: required with rope_type llama3")
        if r.rope_type == "linear" and value is not None:
            raise ConfigError(f"model.rope_scaling.{name}: only applies to rope_type llama3; remove it")
    if r.rope_type == "llama3" and r.high_freq_factor <= r.low_freq_factor:
        raise ConfigError(f"model.rope_scaling: high_freq_factor {r.high_freq_factor} must be > low_freq_factor "
                          f"{r.low_freq_factor}")


def _validate_parallelism(c: Config) -> None:
    p, m = c.parallelism, c.model
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


def _check_source_names(where: str, ds: NanosetDatasetsArgs, named: dict[str, str]) -> None:
    """A source's name (``dataset_folder: {name: folder}``) is a metric name: not empty, no ``/``, one folder for
    the whole run (``named``: the names the earlier stages gave)."""
    for name, folder in zip(ds.names or [], ds.folders):
        if not name or "/" in name:
            raise ConfigError(f"{where}: {name!r} is not a source name; give a name without '/' (e.g. web)")
        same = named.setdefault(name, os.path.normpath(os.path.abspath(folder)))
        if same != os.path.normpath(os.path.abspath(folder)):
            raise ConfigError(f"{where}: {name!r} names {folder!r} here and {same!r} in an earlier stage; a name "
                              f"means one folder for the whole run")


def _validate_stage_schedule(c: Config, stage: DatasetStageArgs, where: str) -> None:
    """A stage's own optimizer and schedule: its minimum below its peak, its warm-up within its steps."""
    if stage.optimizer is None and stage.lr_scheduler is None:
        return
    peak, s = c.stage_optimizer(stage).learning_rate, c.stage_lr_scheduler(stage)
    if s.min_lr > peak:
        raise ConfigError(f"{where}: min_lr {s.min_lr} > learning_rate {peak} (the stage's lr_scheduler.min_lr and "
                          f"optimizer.learning_rate, or the top level's where it gives none); lower min_lr")
    steps = c.stage_end_step(stage) - stage.start_training_step
    if stage.own_schedule and s.warmup_steps > steps:
        raise ConfigError(f"{where}: warmup_steps {s.warmup_steps} > the stage's {steps} steps (its schedule counts "
                          f"from its first step): the learning rate would never reach its peak; give the stage "
                          f"lr_scheduler.warmup_steps ≤ {steps}")


def _validate_stages(c: Config) -> None:
    stages = c.data_stages
    if not stages:
        raise ConfigError("data_stages: at least one stage is needed")
    names = [s.name for s in stages]
    starts = [s.start_training_step for s in stages]
    named: dict[str, str] = {}  # a source's name → its folder, over the run's stages
    for i, s in enumerate(stages):
        where = f"data_stages[{i}] ({s.name})"
        if names.count(s.name) > 1:
            raise ConfigError(f"{where}.name: stage names must be unique; {s.name!r} appears "
                              f"{names.count(s.name)} times")
        if starts.count(s.start_training_step) > 1:
            raise ConfigError(f"{where}.start_training_step: {s.start_training_step} is used by several stages; "
                              f"each stage needs its own start step")
        if s.start_training_step > max(c.tokens.train_steps, 1):  # with 0 steps, the first stage still starts at 1
            raise ConfigError(f"{where}.start_training_step: {s.start_training_step} is outside [1, "
                              f"tokens.train_steps={c.tokens.train_steps}]")
        seq = c.stage_sequence_length(s)
        if seq > c.model.max_position_embeddings:
            raise ConfigError(f"{where}.sequence_length {seq} > model.max_position_embeddings "
                              f"{c.model.max_position_embeddings}")
        _validate_stage_schedule(c, s, where)
        cp = c.parallelism.cp
        if cp > 1 and seq % (2 * cp):
            own = s.sequence_length is not None
            key = f"{where}.sequence_length" if own else f"tokens.sequence_length (of {where})"
            raise ConfigError(f"{key} {seq} is not divisible by 2 × parallelism.cp = {2 * cp}: context parallelism "
                              f"cuts each sample into 2·cp chunks, two per cp rank; use a multiple of {2 * cp} or "
                              f"another cp")
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
            if ds.adaptive is not None:
                _validate_adaptive(f"{where}.data.dataset.dataset_weights.adaptive", ds.adaptive, len(ds.folders),
                                   c.stage_end_step(s) - s.start_training_step)
            elif ds.schedule is not None:
                _validate_schedule(c, s, f"{where}.data.dataset.dataset_weights", ds.schedule, len(ds.folders))
            elif len(ds.weights) != len(ds.folders):
                raise ConfigError(f"{where}.data.dataset.dataset_weights: {len(ds.weights)} weights for "
                                  f"{len(ds.folders)} folders; give one weight per folder")
            elif any(not (w > 0 and math.isfinite(w)) for w in ds.weights):
                raise ConfigError(f"{where}.data.dataset.dataset_weights: weights must be positive and finite, got "
                                  f"{ds.weights}")
            else:
                _check_sum(f"{where}.data.dataset.dataset_weights", ds.weights)
            _check_source_names(f"{where}.data.dataset.dataset_folder", ds, named)
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


def _validate_adaptive(key: str, adaptive: AdaptiveMixingArgs, num_folders: int, stage_steps: int) -> None:
    """Adaptive weights: a known rule (or an importable ``module:function``), one initial weight per folder, a
    floor that leaves room for the weights to move, and a stage long enough to train a decided block."""
    check_rule(adaptive.rule, f"{key}.rule")
    if 2 * adaptive.every >= stage_steps:
        raise ConfigError(f"{key}.every: {adaptive.every}, but the stage has {stage_steps} steps: blocks 1 and 2 "
                          f"(steps 1-{2 * adaptive.every} of it) train with initial, so no decided weight would "
                          f"be trained; give every below {(stage_steps + 1) // 2}")
    if adaptive.initial is not None:
        if len(adaptive.initial) != num_folders:
            raise ConfigError(f"{key}.initial: {len(adaptive.initial)} weights for {num_folders} folders; give one "
                              f"weight per folder")
        if any(not (w > 0 and math.isfinite(w)) for w in adaptive.initial):
            raise ConfigError(f"{key}.initial: weights must be positive and finite, got {adaptive.initial}")
        _check_sum(f"{key}.initial", adaptive.initial)
    if adaptive.exploration == 0:
        raise ConfigError(f"{key}.exploration: 0 keeps every weight at 1/{num_folders} (odm's rate of learning from "
                          f"the losses is its exploration), so nothing would be decided; give a value in (0, "
                          f"{1 / num_folders:g}], or leave it out for the decaying default")
    if adaptive.exploration is not None and adaptive.exploration * num_folders > 1:
        raise ConfigError(f"{key}.exploration: {adaptive.exploration:g} × {num_folders} folders is > 1, which gives "
                          f"the lowest weights to the highest losses; give at most {1 / num_folders:g}")
    if adaptive.min_weight * num_folders >= 1:
        raise ConfigError(f"{key}.min_weight: {adaptive.min_weight:g} × {num_folders} folders is ≥ 1, which leaves "
                          f"the weights nothing to decide; give less than {1 / num_folders:g}")


def _validate_schedule(c: Config, stage: DatasetStageArgs, key: str, schedule: list[WeightsAtStep],
                       num_folders: int) -> None:
    """A weight schedule: entries at increasing steps inside the stage, the first at its start, each with one
    weight ≥ 0 per folder, not all zero."""
    first, end = stage.start_training_step, c.stage_end_step(stage)
    if schedule[0].step != first:
        raise ConfigError(f"{key}[0].step: {schedule[0].step}, but a schedule starts at the stage's first step "
                          f"(start_training_step {first}); make the first entry step: {first}")
    for j, entry in enumerate(schedule):
        where = f"{key}[{j}]"
        if j and entry.step <= schedule[j - 1].step:
            raise ConfigError(f"{where}.step: {entry.step} follows step {schedule[j - 1].step}; the steps of a "
                              f"schedule must increase")
        if not first <= entry.step < end:
            raise ConfigError(f"{where}.step: {entry.step} is outside the stage (steps {first}-{end - 1}); move it "
                              f"inside or into the next stage")
        if len(entry.weights) != num_folders:
            raise ConfigError(f"{where}.weights: {len(entry.weights)} weights for {num_folders} folders; give one "
                              f"weight per folder")
        if any(not (w >= 0 and math.isfinite(w)) for w in entry.weights):
            raise ConfigError(f"{where}.weights: weights must be ≥ 0 and finite, got {entry.weights}")
        if not sum(entry.weights) > 0:
            raise ConfigError(f"{where}.weights: all zero; give at least one folder a positive weight")
        _check_sum(f"{where}.weights", entry.weights)


def _check_sum(key: str, weights: list[float]) -> None:
    """Weights are normalised by their sum: one that overflows would make every share 0."""
    if not math.isfinite(sum(weights)):
        raise ConfigError(f"{key}: {weights} sum to more than a float holds; scale them down (only their ratios "
                          f"count)")


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
    if not v.datasets:
        if v.interval > 0 and not v.holdout:
            raise ConfigError(f"validation.interval is {v.interval} but validation.datasets is empty; name at least "
                              f"one dataset (name: folder), set validation.holdout, or set interval: 0")
        return
    for name in v.datasets:
        folders = v.folders(name)
        if not name or not folders or any(not f for f in folders):
            raise ConfigError(f"validation.datasets.{name}: give a dataset name and at least one folder")
        seen = {os.path.normpath(os.path.abspath(f)) for f in folders}
        if len(seen) != len(folders):
            raise ConfigError(f"validation.datasets.{name}: a folder is listed twice in {folders}; list it once")


def _validate_evaluation(c: Config) -> None:
    """Task names unique and plain (metric names), hooks ``module:function``, an interval with something to run."""
    e = c.evaluation
    if e.interval > 0 and not e.tasks and not e.hooks:
        raise ConfigError(f"evaluation.interval is {e.interval} but evaluation.tasks and evaluation.hooks are empty; "
                          f"add a task ({{name, path}}) or a hook, or set interval: 0")
    names = [t.name for t in e.tasks]
    for i, task in enumerate(e.tasks):
        if not task.name or "/" in task.name or not task.path:
            raise ConfigError(f"evaluation.tasks[{i}]: give a name (without '/') and the path of a JSON-lines file")
        if names.count(task.name) > 1:
            raise ConfigError(f"evaluation.tasks[{i}].name {task.name!r} is used twice; give each task its own name")
    for i, hook in enumerate(e.hooks):
        module, _, function = hook.partition(":")
        if not module or not function.isidentifier():
            raise ConfigError(f"evaluation.hooks[{i}] is {hook!r}; write it as module:function (e.g. "
                              f"my_evals:run_harness)")


WANDB_PROJECT_FORBIDS = "/\\#?%:"  # the characters W&B refuses in a project name (wandb_settings.validate_project)


def _validate_wandb(c: Config) -> None:
    """What W&B would refuse at start-up (where it only stops the logging, with a note): said before the run."""
    w = c.logging.wandb
    if w is None:
        return
    bad = sorted(set(WANDB_PROJECT_FORBIDS) & set(w.project))
    if not w.project or len(w.project) > 128 or bad:
        why = f"contains {' '.join(bad)}" if bad else ("is empty" if not w.project else "is over 128 characters")
        raise ConfigError(f"logging.wandb.project: {w.project!r} {why}; W&B takes 1-128 characters, none of "
                          f"{' '.join(WANDB_PROJECT_FORBIDS)}")
    for name in ("entity", "name"):
        if getattr(w, name) == "":
            raise ConfigError(f"logging.wandb.{name}: empty; give one or remove the key")
    for i, tag in enumerate(w.tags):
        if not 1 <= len(tag) <= 64:
            raise ConfigError(f"logging.wandb.tags[{i}]: {tag!r} has {len(tag)} characters; W&B takes tags of 1-64")


def _validate_surgery(c: Config) -> None:
    """Step ranges and documents well formed, inside the run (the documents file is read at start-up)."""
    s, steps = c.surgery, c.tokens.train_steps
    for text in s.skip_steps:
        a, b = parse_step_range(text, "surgery.skip_steps")
        if b > steps:
            raise ConfigError(f"surgery.skip_steps: {text} ends after tokens.train_steps {steps}; give steps in "
                              f"[1, {steps}]")
    for text in s.exclude_documents:
        parse_document(text, "surgery.exclude_documents")
    if not s.exclude_documents and s.exclude_documents_file is None and s.exclude_from_step != 1:
        raise ConfigError(f"surgery.exclude_from_step: {s.exclude_from_step}, but no document is excluded; give "
                          f"surgery.exclude_documents or surgery.exclude_documents_file, or remove the key")
    if (s.exclude_documents or s.exclude_documents_file is not None) and s.exclude_from_step > steps:
        raise ConfigError(f"surgery.exclude_from_step: {s.exclude_from_step} is after tokens.train_steps {steps}, so "
                          f"nothing would be excised; give a step in [1, {steps}]")
    if s.spike is not None:
        longest = max(c.stage_end_step(st) - st.start_training_step for st in c.data_stages)
        if longest <= s.spike.window:
            raise ConfigError(f"surgery.spike.window: {s.spike.window}, but the longest stage has {longest} steps, so "
                              f"no step would be judged (a step is judged once the window is full); give a window "
                              f"below {longest}")
