"""``python -m runtime.explain --config CFG [--checkpoint CKPT] --step N [--json]``: where a step's data comes from.

Computed without training: the stage, then every sample of the global batch in global order
(the order the trainer uses) with its dataset folder, window (or packed sample) index, epoch,
shards, token range, document ids, the labels that count in the loss (``loss_tokens``), and the
batch's ``data_hash`` (the one in ``metrics.jsonl``). Answers "what
did the model see at step N?". With ``--checkpoint``, the run is the one resuming from that
checkpoint with this config: the past comes from the checkpoint's record, as in the trainer.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from nanoset.errors import report_user_errors
from runtime.checkpoint.layout import find_checkpoint, read_metadata
from runtime.config.load import load_config
from runtime.data.hf_cache import resolve_stage_folders
from runtime.data.order.plan import DataPlan
from runtime.data.order.windows import label_mask


def explain_step(plan: DataPlan, step: int) -> list[dict]:
    """One dict per sample of global step ``step``, in global batch order."""
    stage, loc = plan.global_batch(step)
    data_hash = plan.data_hash(step)
    rows = []
    loss_tokens = np.empty(len(loc.sample), dtype=np.int64)
    for d in np.unique(loc.dataset).tolist():
        m = loc.dataset == d
        loss_tokens[m] = label_mask(plan.datasets[d], loc.sample[m], stage.use_position_ids).sum(axis=1)
    for pos, (d, s, e) in enumerate(zip(loc.dataset.tolist(), loc.sample.tolist(), loc.epoch.tolist())):
        w = plan.datasets[d]
        start, stop = w.token_range(s)
        reader = w.reader
        first = int(np.searchsorted(reader.token_offsets, start, side="right")) - 1
        last = int(np.searchsorted(reader.token_offsets, stop - 1, side="right")) - 1
        rows.append({
            "step": step, "stage": stage.name, "data_hash": data_hash, "position": pos, "dataset": w.folder,
            "sample": s, "epoch": e,
            "shards": [sh.name for sh in reader.shards[first : last + 1]], "tokens": [start, stop],
            "documents": reader.document_ids(start, stop).tolist(), "packing": w.packing,
            "loss_tokens": int(loss_tokens[pos]),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.explain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--checkpoint", help="a checkpoint folder (step-N): explain the run that resumes from it")
    ap.add_argument("--step", required=True, type=int)
    ap.add_argument("--json", action="store_true", help="print a JSON list, one object per sample")
    args = ap.parse_args(argv)
    return report_user_errors(lambda: explain(args.config, args.checkpoint, args.step, args.json))


def explain(config_path: str, checkpoint: str | None, step: int, as_json: bool) -> int:
    config = load_config(config_path)
    plan = DataPlan(config, resolve_stage_folders(config))
    if checkpoint:
        path = find_checkpoint(checkpoint, "checkpoint ")
        plan = plan.resumed_from(path, read_metadata(path, model=False))
    rows = explain_step(plan, step)
    if as_json:
        print(json.dumps(rows))
        return 0
    print(f"step {step}: stage {rows[0]['stage']!r}, {len(rows)} samples, data_hash {rows[0]['data_hash']}")
    for r in rows:
        docs = r["documents"]
        doc_text = f"{docs[0]}..{docs[-1]}" if len(docs) > 2 else ",".join(map(str, docs))
        print(f"  {r['position']:>5}  {r['dataset']}  sample {r['sample']}  epoch {r['epoch']}  "
              f"tokens [{r['tokens'][0]}, {r['tokens'][1]})  shards {','.join(r['shards'])}  documents {doc_text}  "
              f"loss_tokens {r['loss_tokens']}")
    return 0

