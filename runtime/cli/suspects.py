"""``nanoset explain --config CFG --suspects STEP [--checkpoint CKPT] [--top N] [--json]``: a spike's suspects.

The samples of step ``STEP`` and their documents, highest mean token loss first: from the run's
``spikes.jsonl`` (the step's own per-sample losses, logged as it trained), or, with ``--checkpoint``
(the checkpoint of step ``STEP - 1``), recomputed by a forward pass of that checkpoint's model on the
step's samples in this process, for a step that was not logged. Both count the loss as the training step
does, so they agree to float rounding. The output ends with the command that excises the suspects'
documents: the samples whose mean token loss is above the step's loss (the ones that lifted it), or the
``--top N`` highest; their documents are written to ``<run_dir>/suspects-step-STEP.txt``, one
``FOLDER:DOC`` a line, which is what ``--exclude-documents`` (and ``explain --documents``) reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nanoset.atomic import atomic_write_text
from nanoset.errors import ConfigError
from runtime.checkpoint.layout import (
    CHECKPOINT_OPTION,
    check_same_model,
    checkpoint_step,
    checkpoints_folder,
    saved_checkpoints,
)
from runtime.checkpoint.record import read_metadata
from runtime.config import Config
from runtime.config.overrides import suggested_command
from runtime.data.order.plan import DataPlan
from runtime.data.order.provenance import explain_step
from runtime.observe.spikes import SPIKES_FILE, ranked_samples
from runtime.observe.step_log import read_rows


def logged_spike(config: Config, step: int) -> dict:
    """The row of ``step`` in the run's spikes.jsonl; a step that is not in it is one line saying what to do."""
    path = config.general.run_path / SPIKES_FILE
    rows = read_rows(path) if path.is_file() else []
    row = next((r for r in rows if r["step"] == step), None)
    if row is None:
        logged = ", ".join(str(r["step"]) for r in rows[:20]) or "none"
        raise ConfigError(f"--suspects {step}: {path} has no row of step {step} (steps logged: {logged}); recompute "
                          f"them with --checkpoint, the checkpoint of step {step - 1}")
    return row


def recomputed_spike(config: Config, plan: DataPlan, path: Path, step: int) -> dict:
    """The row of ``step`` as spikes.jsonl would hold it (``z`` null), from a forward pass of the checkpoint of
    step ``step - 1`` on the step's global batch, in this process."""
    record = read_metadata(path)
    if record.last_step != step - 1:
        raise ConfigError(f"--checkpoint {path} is of step {record.last_step}; --suspects {step} recomputes from "
                          f"the checkpoint of step {step - 1} (the weights step {step} trained from)")
    check_same_model(config, record, path, CHECKPOINT_OPTION)
    samples = _forward(config, plan, path, step)
    loss = float(samples.loss.sum() / max(int(samples.label_tokens.sum()), 1))
    return {"step": step, "stage": plan.stage_for_step(step).name, "loss": loss, "z": None,
            "samples": ranked_samples(samples, explain_step(plan, step))}


def _forward(config: Config, plan: DataPlan, path: Path, step: int):
    """Per-sample losses of ``step``'s global batch under the checkpoint's weights (one process, the config's
    micro-batch size; the data order is the config's, whatever its layout)."""
    import torch.distributed as dist

    from runtime.checkpoint.store import load_dcp, model_state
    from runtime.cli.validate import layout_for_world
    from runtime.data.loading.collator import collator_class
    from runtime.data.loading.dataset import StageDataset
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    stage = plan.stage_for_step(step)
    one = layout_for_world(config, 1)
    engine = Engine(one, ParallelContext(), initialize=False)
    try:
        load_dcp({"model": model_state(engine)}, path, "choose another checkpoint")
        dataset, rows = StageDataset(plan, stage), config.tokens.micro_batch_size
        collate = collator_class(stage.use_position_ids)(stage.sequence_length, 0, 0, pp_rank=0)
        first = (step - stage.start_step) * stage.global_batch_size
        batches = [collate(dataset.__getitems__(list(range(j, j + rows))))
                   for j in range(first, first + stage.global_batch_size, rows)]
        return engine.sample_losses(batches)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def suspects(row: dict, top: int | None) -> list[dict]:
    """The samples to excise: the ``top`` highest, or those whose mean token loss is above the step's loss."""
    ranked = [s for s in row["samples"] if s["loss"] is not None]
    return ranked[:top] if top is not None else [s for s in ranked if s["loss"] > row["loss"]]


def excision_file(config: Config, step: int, chosen: list[dict]) -> Path:
    """``<run_dir>/suspects-step-STEP.txt``: the chosen samples' documents, one FOLDER:DOC a line, each once."""
    lines = dict.fromkeys(f"{s['dataset']}:{d}" for s in chosen if s["dataset"] is not None for d in s["documents"])
    path = config.general.run_path / f"suspects-step-{step}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path


def rewind_point(config: Config, step: int) -> int | None:
    """The step of the run's latest complete checkpoint before ``step`` (where a rewind that excises from ``step``
    on goes back to); None when there is none."""
    before = [s for p in saved_checkpoints(checkpoints_folder(config)) if (s := checkpoint_step(p.name)) < step]
    return max(before) if before else None


def print_suspects(config: Config, row: dict, source: str, top: int | None, as_json: bool) -> int:
    step = row["step"]
    if top is not None and top < 1:
        raise ConfigError(f"--top {top}: give a number of samples ≥ 1")
    if as_json:
        print(json.dumps(row["samples"]))
        return 0
    z = f", z {row['z']:.1f}" if row.get("z") is not None else ""
    print(f"step {step} ({row['stage']!r}): loss {row['loss']:.4f}{z}; {len(row['samples'])} samples, highest "
          f"loss first ({source})")
    for rank, s in enumerate(row["samples"], 1):
        loss = f"{s['loss']:.4f}" if s["loss"] is not None else "-"
        docs = s["documents"] or []
        shown = f"{docs[0]}..{docs[-1]}" if len(docs) > 2 else ",".join(map(str, docs))
        print(f"  {rank:>4}  loss {loss:>8}  label_tokens {s['label_tokens']:>6}  {s['dataset']}  sample "
              f"{s['sample']}  documents {shown}")
    chosen = suspects(row, top)
    if not chosen or all(s["dataset"] is None for s in chosen):
        print("no suspects to excise" + (" (the batches were a custom loader's: no documents known)"
                                         if chosen else ""))
        return 0
    path = excision_file(config, step, chosen)
    count = len(path.read_text().splitlines())
    which = f"the top {top}" if top is not None else "those above the step's loss"
    mean = np.mean([s["loss"] for s in chosen])
    point = rewind_point(config, step)
    if point is None:
        print(f"suspects: {len(chosen)} samples ({which}, mean loss {mean:.4f}), {count} documents, in {path}; "
              f"{checkpoints_folder(config)} has no checkpoint before step {step} to rewind to: exclude them from "
              f"step 1 in a new run (surgery.exclude_documents_file)")
        return 0
    print(f"suspects: {len(chosen)} samples ({which}, mean loss {mean:.4f}), {count} documents, in {path}; to "
          f"excise them from step {point + 1} on (the latest checkpoint before step {step} is of step {point}):")
    print(f"  {suggested_command(config.arguments, 'train', '--rewind-to', point, '--exclude-documents', path)}")
    return 0
