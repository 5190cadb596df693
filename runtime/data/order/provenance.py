"""Which steps trained on a document: the reverse of ``explain``, through the plan (and its record).

Document ``DOC`` of a folder is tokens ``[a, b)`` of its stream, so the samples holding any of them
are a short range: the windows ``i`` with ``i·L < b`` and ``i·L + L + 1 > a``, or the packed samples
overlapping it. Each sample is drawn once per epoch ``e``, as draw ``e·n + perm_e⁻¹(i)`` of its dataset
(the Feistel permutation is inverted round by round). The parts of the plan take consecutive
draw ranges of a dataset (across stages, resumes and batch-size changes), and each part's blend
maps a draw back to its sample ``j`` of the part, so to its step and position in the global batch.
The work is O(epochs × samples touching the documents), whatever the number of steps. ``explain_step`` is
the forward question: the samples of one step, what ``explain --step`` and a spike's log name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nanoset.stats import truncate
from runtime.config import ConfigError
from runtime.data.order import surgery
from runtime.data.order.plan import DataPlan
from runtime.data.order.sample_space import SampleSpace
from runtime.data.order.source_names import source_names
from runtime.data.order.windows import label_mask


def parse_document(text: str, where: str = "--document") -> tuple[str, int]:
    """``FOLDER:DOC`` → (folder, document index); a bad form is a ``ConfigError`` naming ``where``."""
    return surgery.parse_document(text, where)


def datasets_of(plan: DataPlan, folder: str) -> list[int]:
    """The plan's datasets (one per sequence length and packing) read from ``folder``: a folder of a stage, or
    the Hugging Face source of a stage (whose tokenized copy the plan reads)."""
    return plan.datasets_named(folder)


def samples_touching(windows: SampleSpace, start: int, stop: int) -> np.ndarray:
    """The samples of ``windows`` (windows or packed samples) holding any token of ``[start, stop)``."""
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    if windows.packing == "window":
        L = windows.sequence_length
        first = max(0, (start - L - 1) // L + 1)  # i·L + L + 1 > start
        last = min(windows.num_samples - 1, (stop - 1) // L)  # i·L < stop
        return np.arange(first, last + 1, dtype=np.int64)
    lo = int(np.searchsorted(windows.stops, start, side="right"))  # stops[i] > start (starts, stops ascend)
    hi = int(np.searchsorted(windows.starts, stop, side="left"))  # starts[i] < stop
    return np.arange(lo, hi, dtype=np.int64)


def document_steps(plan: DataPlan, queries: list[tuple[str, int]]) -> list[dict]:
    """Every (step, position, sample, token range) of the run that held a token of each ``(folder, doc)``.

    One dict per hit, sorted by (query, step, position): ``document`` (``FOLDER:DOC`` as given), ``step``,
    ``stage``, ``position``, ``dataset`` (the folder as ``explain`` prints it), ``sample``, ``epoch``,
    ``tokens`` (the sample's range, as ``explain``), ``skipped`` (``"surgery"`` for a step read but not trained).
    A document asked for twice is answered once."""
    queries = list(dict.fromkeys(queries))  # an audit list may name a document twice: its hits count once
    by_dataset: dict[int, list[tuple[int, np.ndarray]]] = {}
    for q, (folder, doc) in enumerate(queries):
        for d in datasets_of(plan, folder):
            reader = plan.datasets[d].reader
            if not 0 <= doc < reader.num_documents:
                raise ConfigError(f"{folder}:{doc}: {folder} has {reader.num_documents} documents; give an index in "
                                  f"[0, {reader.num_documents})")
            by_dataset.setdefault(d, []).append((q, samples_touching(plan.datasets[d], *reader.document_bounds(doc))))
    hits = []
    names = source_names(plan)
    for d, wanted in by_dataset.items():
        samples = np.concatenate([s for _, s in wanted])
        query = np.concatenate([np.full(len(s), q, dtype=np.int64) for q, s in wanted])
        for q, step, position, sample, epoch in _hits(plan, d, samples, query):
            start, stop = plan.datasets[d].token_range(sample)
            hits.append({"document": f"{queries[q][0]}:{queries[q][1]}", "step": step,
                         "stage": plan.stage_for_step(step).name, "position": position,
                         "dataset": plan.datasets[d].folder, "source": names[plan.datasets[d].folder],
                         "sample": sample, "epoch": epoch,
                         "tokens": [int(start), int(stop)], "query": q,
                         "skipped": "surgery" if plan.surgery.skips(step) else None})
    hits.sort(key=lambda h: (h["query"], h["step"], h["position"]))
    for h in hits:
        del h["query"]
    return hits


def _hits(plan: DataPlan, d: int, samples: np.ndarray, query: np.ndarray):
    """(query, step, position, sample, epoch) of every draw of dataset ``d`` that took one of ``samples``."""
    parts = []  # (part, local index, first draw, draws taken)
    for part in plan.stages:
        if d in part.dataset_ids:
            local = part.dataset_ids.index(d)
            taken = int(part.blend.draws(part.num_samples)[local])
            parts.append((part, local, int(part.draw_offsets[local]), taken))
    total = plan.stream_position(d, max((first + taken for _, _, first, taken in parts), default=0))
    n = plan.datasets[d].num_samples
    unique, back = np.unique(samples, return_inverse=True)
    for epoch in range(-(-total // n)):
        position = epoch * n + plan.permutation(d, epoch).inverse(unique)[back]
        draw = plan.draw_indexes[d].draws(position, samples)  # -1: passed over (excised by surgery)
        for part, local, first, taken in parts:
            sel = np.flatnonzero((draw >= first) & (draw < first + taken))
            if not len(sel):
                continue
            j = part.blend.position(np.full(len(sel), local), draw[sel] - first)
            step, position = np.divmod(j, part.global_batch_size)
            yield from zip(query[sel].tolist(), (part.start_step + step).tolist(), position.tolist(),
                           samples[sel].tolist(), [epoch] * len(sel))


def explain_step(plan: DataPlan, step: int, decoders: dict[int, Any] | None = None,
                 max_chars: int | None = None) -> list[dict]:
    """One dict per sample of global step ``step``, in global batch order; with ``decoders`` (dataset id →
    tokenizer) its ``text`` too: the sample's ids decoded (cut to ``max_chars`` characters, ending with "…")."""
    stage, loc = plan.global_batch(step)
    data_hash = plan.data_hash(step, loc)
    skipped = "surgery" if plan.surgery.skips(step) else None  # read, not trained
    rows = []
    names = source_names(plan)
    loss_tokens = np.empty(len(loc.sample), dtype=np.int64)
    for d in np.unique(loc.dataset).tolist():
        m = loc.dataset == d
        loss_tokens[m] = label_mask(plan.datasets[d], loc.sample[m], stage.use_position_ids).sum(axis=1)
    for pos, (d, s, e) in enumerate(zip(loc.dataset.tolist(), loc.sample.tolist(), loc.epoch.tolist())):
        w = plan.datasets[d]
        start, stop = w.token_range(s)
        reader = w.reader
        first, last = reader.shard_of_token(start), reader.shard_of_token(stop - 1)
        rows.append({
            "step": step, "stage": stage.name, "data_hash": data_hash, "position": pos, "dataset": w.folder,
            "source": names[w.folder], "sample": s, "epoch": e,
            "shards": [sh.name for sh in reader.shards[first : last + 1]], "tokens": [start, stop],
            "documents": reader.document_ids(start, stop).tolist(), "packing": w.packing,
            "loss_tokens": int(loss_tokens[pos]), "skipped": skipped,
        })
        if decoders is not None:
            text = decoders[d].decode(reader.tokens(start, stop).tolist(), skip_special_tokens=False)
            rows[-1]["text"] = truncate(text, max_chars) if max_chars is not None else text
    return rows
