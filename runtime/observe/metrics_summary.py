"""``nanoset metrics RUN_DIR``: a run's summary from its ``metrics.jsonl`` (running or finished).

Per stage: steps, tokens, training time (the steps' own durations, ``tokens / tokens_per_s``: validation and
checkpoint saves left out), tokens/s, first/last/min loss, per-source last loss and share of the samples, the
last validation losses, skipped steps, and the last mixing weights where the rows carry ``weights``. Plain
``json``, no torch: the toolkit command imports it as it is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError
from runtime.observe import step_log

METRICS_FILE = "metrics.jsonl"


def metrics_path(run: str | Path) -> Path:
    """``RUN_DIR/metrics.jsonl`` (or the file itself when given)."""
    path = Path(run)
    path = path if path.name.endswith(".jsonl") and not path.is_dir() else path / METRICS_FILE
    if not path.is_file():
        raise NanosetError(f"{path}: no such file; pass a run folder (general.run_dir of the config) that has "
                           f"trained at least one step")
    return path


def read_rows(run: str | Path) -> tuple[list[dict], list[dict]]:
    """(training rows, validation rows) in step order, the last row of a step kept (a killed run's steps after its
    checkpoint are trained again); a torn line (a run being killed while it wrote) is left out."""
    path = metrics_path(run)
    train: dict[int, dict] = {}
    val: dict[int, dict] = {}
    for row in step_log.read_rows(path):
        if "eval" not in row:  # evaluation rows: read by their own readers
            (val if "val" in row else train)[row["step"]] = row
    if not train and not val:
        raise NanosetError(f"{path}: no step logged yet; run it again once the run has trained a step")
    return [train[s] for s in sorted(train)], [val[s] for s in sorted(val)]


def finite_loss(row: dict) -> float | None:
    """A training row's loss, None for a skipped (non-finite) step."""
    loss = row.get("loss")
    return loss if isinstance(loss, (int, float)) and math.isfinite(loss) and not row.get("skipped") else None


def step_seconds(row: dict) -> float | None:
    """How long the step took: its tokens over its tokens/s (None for a row without tokens)."""
    tokens, rate = row.get("tokens"), row.get("tokens_per_s")
    return tokens / rate if tokens and rate else None


def _sum(values: list) -> Any:
    return None if not values or any(v is None for v in values) else sum(values)


def _stage(name: str, rows: list[dict], val_rows: list[dict]) -> dict[str, Any]:
    losses = [(r["step"], loss) for r in rows if (loss := finite_loss(r)) is not None]
    trained = [r for r in rows if r.get("skipped") != "surgery"]  # a step surgery skips reads its data, trains none
    tokens, seconds = _sum([r.get("tokens") for r in trained]), _sum([step_seconds(r) for r in trained])
    low = min(losses, key=lambda sl: sl[1]) if losses else None
    sources: dict[str, dict[str, Any]] = {}
    for r in rows:
        for folder, s in (r.get("sources") or {}).items():
            entry = sources.setdefault(folder, {"last_loss": None, "last_step": None, "samples": 0, "label_tokens": 0})
            entry["samples"] += s["samples"]
            entry["label_tokens"] += s["label_tokens"]
            if s.get("loss") is not None:
                entry["last_loss"], entry["last_step"] = s["loss"], r["step"]
    samples = sum(e["samples"] for e in sources.values())
    for e in sources.values():
        e["share"] = e["samples"] / samples if samples else None
    last_val = val_rows[-1] if val_rows else None
    weighted = [r for r in rows if isinstance(r.get("weights"), dict)]  # rows of a stage that logs its mix weights
    return {
        "name": name, "first_step": rows[0]["step"] if rows else None, "last_step": rows[-1]["step"] if rows else None,
        "steps": len(rows), "tokens": tokens, "time_s": seconds,
        "tokens_per_s": tokens / seconds if tokens and seconds else None,
        "label_tokens": _sum([r.get("label_tokens") for r in trained]),
        "loss": {"first": losses[0][1] if losses else None, "last": losses[-1][1] if losses else None,
                 "min": low[1] if low else None, "min_step": low[0] if low else None},
        "skipped_steps": [r["step"] for r in rows if r.get("skipped")],
        "sources": sources,
        "weights": {"step": weighted[-1]["step"], "weights": weighted[-1]["weights"]} if weighted else None,
        "validation": ({"step": last_val["step"], "loss": {n: v.get("loss") for n, v in last_val["val"].items()}}
                       if last_val else None),
    }


def summarize(run: str | Path) -> dict[str, Any]:
    """The summary of the run in ``run`` (its folder or its metrics.jsonl), as plain JSON values."""
    train, val = read_rows(run)
    names = list(dict.fromkeys(r["stage"] for r in train + val))  # stage order: as the rows first name them
    stages = [_stage(n, [r for r in train if r["stage"] == n], [r for r in val if r["stage"] == n]) for n in names]
    tokens, seconds = _sum([s["tokens"] for s in stages]), _sum([s["time_s"] for s in stages])
    return {
        "run": str(run), "steps": len(train), "last_step": train[-1]["step"] if train else None,
        "tokens": tokens, "time_s": seconds, "tokens_per_s": tokens / seconds if tokens and seconds else None,
        "skipped_steps": [s for st in stages for s in st["skipped_steps"]], "stages": stages,
    }


def first_difference(run_a: str | Path, run_b: str | Path) -> dict[str, Any]:
    """Where two runs part (e.g. a run and its rewound branch): the steps both logged, and the first of them whose
    loss differs (None where every common step has the same loss)."""
    a = {r["step"]: r.get("loss") for r in read_rows(run_a)[0]}
    b = {r["step"]: r.get("loss") for r in read_rows(run_b)[0]}
    common = sorted(a.keys() & b.keys())
    differ = next((s for s in common if a[s] != b[s]), None)
    return {"common_steps": len(common), "first_common_step": common[0] if common else None,
            "last_common_step": common[-1] if common else None, "first_different_step": differ}


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _count(value: float | int | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:,.0f}{unit}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    minutes, seconds = divmod(value, 60)
    return f"{value:.1f} s" if value < 60 else f"{int(minutes)} min {seconds:.0f} s"


def render(summary: dict[str, Any]) -> str:
    """The text ``nanoset metrics`` prints: losses with 4 decimals, as the console prints them."""
    first = summary["stages"][0]["first_step"] if summary["stages"] else None
    out = [f"{summary['run']}: {summary['steps']} steps ({first}-{summary['last_step']}), "
           f"{len(summary['stages'])} stages, {_count(summary['tokens'])} tokens in {_seconds(summary['time_s'])} "
           f"({_count(summary['tokens_per_s'])} tokens/s), {len(summary['skipped_steps'])} skipped steps"]
    for st in summary["stages"]:
        loss = st["loss"]
        out.append(f"stage {st['name']!r}: steps {st['first_step']}-{st['last_step']} ({st['steps']}), "
                   f"tokens {_count(st['tokens'])}, time {_seconds(st['time_s'])}, "
                   f"tokens/s {_count(st['tokens_per_s'])}")
        low = f" (step {loss['min_step']})" if loss["min_step"] is not None else ""
        skipped = ", ".join(map(str, st["skipped_steps"])) or "none"
        out.append(f"  loss first {_loss(loss['first'])}, last {_loss(loss['last'])}, min {_loss(loss['min'])}{low}"
                   f"; skipped steps: {skipped}")
        for folder, s in st["sources"].items():
            share = "n/a" if s["share"] is None else f"{100 * s['share']:.1f}%"
            out.append(f"  source {folder}: last loss {_loss(s['last_loss'])}, {share} of the samples")
        if st["weights"]:
            weights = ", ".join(f"{n} {w:.4g}" if isinstance(w, (int, float)) else f"{n} {w}"
                                for n, w in st["weights"]["weights"].items())
            out.append(f"  weights at step {st['weights']['step']}: {weights}")
        if st["validation"]:
            vals = ", ".join(f"{n} {_loss(v)}" for n, v in st["validation"]["loss"].items())
            out.append(f"  validation at step {st['validation']['step']}: {vals}")
    return "\n".join(out)


def render_difference(a: str, b: str, diff: dict[str, Any]) -> str:
    if not diff["common_steps"]:
        return f"{a} and {b}: no step in common"
    where = (f"the losses first differ at step {diff['first_different_step']}" if diff["first_different_step"]
             is not None else "every common step has the same loss")
    return (f"{a} and {b}: {diff['common_steps']} steps in common ({diff['first_common_step']}-"
            f"{diff['last_common_step']}); {where}")
