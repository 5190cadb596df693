"""``nanoset metrics RUN_DIR --plot FILE.png``: a run's curves against step, from its ``metrics.jsonl``.

Loss (raw and smoothed) with per-source and validation losses (a validation series broken where what it measures
changes), stage boundaries marked; the learning rate; and
the per-source mixing weights when the rows carry them (``weights: {folder: w}``). ``--compare`` overlays a
second run (dashed). matplotlib is an extra (``plot``): without it, one line says how to install it.
"""

from __future__ import annotations

import io
from pathlib import Path

from nanoset.atomic import atomic_write
from nanoset.errors import NanosetError
from runtime.observe.metrics_summary import finite_loss, read_rows

INSTALL = "pip install -e '.[plot]' in the checkout (or pip install matplotlib)"


def smoothed(values: list[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values at each point (fewer at the start); the plot smooths each
    stage apart, so a stage's first steps show its own level, not the previous stage's."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise NanosetError(f"--plot needs matplotlib, which is not installed: {INSTALL}") from None
    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    return plt


def _weights(train: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in train:
        for name, w in (r.get("weights") or {}).items():
            if isinstance(w, (int, float)):
                out.setdefault(name, []).append((r["step"], w))
    return out


def _draw(axes, run: str, train: list[dict], val: list[dict], style: str, label_prefix: str) -> None:
    loss_ax, lr_ax = axes[0], axes[1]
    points = [(r["step"], loss, r["stage"]) for r in train if (loss := finite_loss(r)) is not None]
    if points:
        steps, losses, _ = zip(*points)
        line = loss_ax.plot(steps, losses, style, alpha=0.45, linewidth=0.8, label=f"{label_prefix}loss")[0]
        window = max(1, min(25, len(losses) // 10))
        for i, stage in enumerate(dict.fromkeys(st for _, _, st in points)):  # a stage's level is its own
            part = [(s, loss) for s, loss, st in points if st == stage]
            loss_ax.plot([s for s, _ in part], smoothed([loss for _, loss in part], window), style,
                         color=line.get_color(), linewidth=1.8,
                         label=None if i else f"{label_prefix}loss (smoothed)")
    sources: dict[str, list[tuple[int, float]]] = {}
    for r in train:
        if len(r.get("sources") or {}) < 2:  # one source's loss is the loss itself
            continue
        for folder, s in r["sources"].items():
            if s.get("loss") is not None:
                sources.setdefault(folder, []).append((r["step"], s["loss"]))
    for folder, pts in sources.items():
        loss_ax.plot(*zip(*pts), style, linewidth=0.9, label=f"{label_prefix}loss {folder}")
    names = list(dict.fromkeys(n for r in val for n in r["val"]))
    for name in names:
        color = None
        for i, pts in enumerate(validation_segments(val, name)):  # one series, broken where what it measures changes
            color = loss_ax.plot(*zip(*pts), style, marker="o", markersize=4, color=color,
                                 label=None if i else f"{label_prefix}val {name}")[0].get_color()
    lr = [(r["step"], r["lr"]) for r in train if isinstance(r.get("lr"), (int, float))]
    if lr:
        lr_ax.plot(*zip(*lr), style, label=f"{label_prefix}lr")
    if len(axes) > 2:
        for name, pts in _weights(train).items():
            axes[2].plot(*zip(*pts), style, label=f"{label_prefix}{name}")


def validation_segments(val: list[dict], name: str) -> list[list[tuple[int, float]]]:
    """The (step, loss) points of validation set ``name``, cut into segments wherever anything about the set other
    than its loss changes (its ``sequence_length``, its ``tokens``: another quantity, not progress), so the plot
    never joins points of two different measurements."""
    segments: list[list[tuple[int, float]]] = []
    previous = object()
    for r in val:
        v = r["val"].get(name) or {}
        if v.get("loss") is None:
            continue
        what = sorted((k, x) for k, x in v.items() if k not in ("loss", "ppl"))
        if what != previous:
            segments.append([])
            previous = what
        segments[-1].append((r["step"], v["loss"]))
    return segments


def _stage_starts(train: list[dict]) -> list[tuple[int, str]]:
    starts, previous = [], None
    for r in train:
        if r["stage"] != previous:
            starts.append((r["step"], r["stage"]))
            previous = r["stage"]
    return starts


def plot(run: str | Path, out: str | Path, compare: str | Path | None = None) -> Path:
    """Draw the curves of ``run`` (and ``compare``, dashed) into the PNG ``out``, written atomically."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise NanosetError(f"--plot {out}: the plot is a PNG; name a FILE.png")
    if not out.parent.is_dir():
        raise NanosetError(f"--plot {out}: no folder {out.parent}; create it or name a file in an existing folder")
    runs = [(str(run), *read_rows(run))] + ([(str(compare), *read_rows(compare))] if compare is not None else [])
    plt = _pyplot()
    weighted = any(_weights(train) for _, train, _ in runs)
    fig, axes = plt.subplots(3 if weighted else 2, 1, figsize=(9, 8.5 if weighted else 6.5), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1, 1] if weighted else [3, 1]})
    for i, (name, train, val) in enumerate(runs):
        _draw(axes, name, train, val, "-" if i == 0 else "--", f"{name}: " if compare is not None else "")
    for i, (step, stage) in enumerate(_stage_starts(runs[0][1])):
        if i:
            for ax in axes:
                ax.axvline(step - 0.5, color="grey", linestyle=":", linewidth=1)
        axes[0].text(step - 0.5, 1.0, f" {stage}", transform=axes[0].get_xaxis_transform(), va="top", fontsize=8)
    axes[0].set_title(f"{runs[0][0]}" + (f" vs {runs[1][0]} (dashed)" if compare is not None else ""))
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("learning rate")
    if weighted:
        axes[2].set_ylabel("mixing weight")
    axes[-1].set_xlabel("step")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    atomic_write(out, lambda f: f.write(buffer.getvalue()))
    return out
