"""Per-step logging: one line on the console, one JSON object per step in ``run_dir/metrics.jsonl``,
TensorBoard events when the package is installed. Global rank 0 writes; others stay quiet.

A step's row holds ``sources`` when its batches carried source ids: per dataset folder (as
``explain`` prints it) its samples, label tokens and loss (null without label tokens: the file
stays strict JSON), and TensorBoard gets ``loss/NAME`` and ``mix/NAME`` (its share of the samples)
under a short name unique in the run."""

from __future__ import annotations

import errno
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.control.preemption import leave_a_closed_terminal
from runtime.control.progress import duration
from runtime.models.registry import spec_of
from runtime.observe import step_log

# dense bf16 peak FLOP/s by device name fragment, for MFU; the first fragment the name holds decides, so the
# variants come before their family (H100 PCIe and the NVL cards run at lower clocks than the SXM parts)
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H800 PCIe": 756e12, "GB200": 2500e12,
              "B200": 2250e12, "H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
              "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def peak_flops_of(name: str) -> float | None:
    """Dense bf16 peak of a device called ``name`` (``torch.cuda.get_device_name``); None for one not listed."""
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def flops_per_token(model_args, sequence_length: int) -> float:
    """Training FLOPs per token: 6 · parameters (matmuls) + attention scores and values, forward and backward,
    over the query width (heads · head size, which need not be the hidden size) and the whole sequence (PaLM's
    convention: the work a causal or document mask skips is counted too)."""
    h, n, v = model_args.hidden_size, model_args.num_hidden_layers, model_args.vocab_size
    q = model_args.num_attention_heads * model_args.head_size
    params = n * spec_of(model_args).layer_matmul_parameters(model_args) + h * v
    return 6 * params + 12 * n * q * sequence_length


SURGERY_SKIP = "surgery"  # a row's ``skipped`` for a step that data surgery skips (no forward, backward, update)


@dataclass(frozen=True)
class ParameterCount:
    """The model's parameters, each counted once whatever the layout: the vocabulary matrices (the input embedding,
    and the output head when it is not tied to it) and the rest (attention, MLP, norms)."""

    embedding: int
    rest: int
    tied: bool

    @property
    def total(self) -> int:
        return self.embedding + self.rest

    def describe(self) -> str:
        """The start-up line: total, embedding vs the rest."""
        matrices = "tied with the output head" if self.tied else "input embedding and output head"
        return (f"model: {self.total:,} parameters ({_millions(self.total)}): embedding {self.embedding:,} "
                f"({matrices}) + the rest {self.rest:,}")


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def parameter_count(model_args) -> ParameterCount:
    """The parameters of the decoder that ``model_args``' family builds (its spec counts a layer's)."""
    h, n, v = model_args.hidden_size, model_args.num_hidden_layers, model_args.vocab_size
    layer = spec_of(model_args).layer_parameters(model_args)
    tied = model_args.tie_word_embeddings
    return ParameterCount(embedding=v * h * (1 if tied else 2), rest=n * layer + h, tied=tied)



def source_metrics(folders: list[str], totals: list[tuple[int, int, float]]) -> dict[str, dict]:
    """The ``sources`` of a row: per folder ``{"samples", "label_tokens", "loss"}`` (the mean over its label
    tokens, null when it has none or is not finite) from the engine's (samples, label tokens, Σ loss)."""
    out = {}
    for folder, (samples, tokens, loss_sum) in zip(folders, totals):
        loss = loss_sum / tokens if tokens else None
        out[folder] = {"samples": samples, "label_tokens": tokens,
                       "loss": loss if loss is not None and math.isfinite(loss) else None}
    return out


def short_names(labels: dict[str, str]) -> dict[str, str]:
    """Key → a short name unique among ``labels``' values (paths): the last component, with as many parent
    components as it takes to tell two apart, and ``-2``, ``-3``, ... for the same path given twice."""
    parts = {k: [p for p in Path(v).parts if p != "/"] or [v] for k, v in labels.items()}
    depth = dict.fromkeys(labels, 1)
    while True:
        names = {k: "/".join(parts[k][-depth[k]:]) for k in labels}
        others: dict[str, set[str]] = {}  # name → the paths that have it
        for k, n in names.items():
            others.setdefault(n, set()).add(labels[k])
        deeper = [k for k in labels if len(others[names[k]]) > 1 and depth[k] < len(parts[k])]
        if not deeper:
            break
        for k in deeper:
            depth[k] += 1
    out, seen = {}, {}
    for k, n in names.items():
        seen[n] = seen.get(n, 0) + 1
        out[k] = n if seen[n] == 1 else f"{n}-{seen[n]}"
    return out


def scalars(record: dict, source_names: dict[str, str]) -> dict[str, float]:
    """A metrics.jsonl row as the scalars TensorBoard and W&B get, by name (null values left out): every number of
    the row under its key; per source ``loss/NAME``, ``mix/NAME`` (its share of the step's samples), each other
    number as ``FIELD/NAME`` and ``mix/weight/NAME`` (the weight it was drawn with); per validation set
    ``val/NAME/FIELD``; any other mapping's numbers as ``KEY/NAME``. NAME: a folder's short name (``short_names``)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if key == "sources":
            samples = sum(s["samples"] for s in value.values())
            for folder, s in value.items():
                name = source_names.get(folder, folder)
                if _number(s.get("loss")):
                    out[f"loss/{name}"] = s["loss"]
                out[f"mix/{name}"] = s["samples"] / samples if samples else 0.0
                out.update({f"{field}/{name}": v for field, v in s.items() if field != "loss" and _number(v)})
        elif key == "weights":  # the weights the step was drawn with
            out.update({f"mix/weight/{source_names.get(k, k)}": v for k, v in value.items() if _number(v)})
        elif key in ("val", "eval"):
            for name, r in value.items():
                out.update({f"val/{name}/{field}": v for field, v in r.items() if _number(v)})
        elif isinstance(value, dict):
            out.update({f"{key}/{source_names.get(k, k)}": v for k, v in value.items() if _number(v)})
        elif _number(value):
            out[key] = value
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and (not isinstance(value, float) or math.isfinite(value))


def tokens_per_second(config, sequence_length: int, seconds: float) -> float:
    """Tokens of one global batch per second, each token once: the tp and cp ranks of a replica share its
    samples (cp ranks split their sequences), so neither adds a token."""
    return config.global_batch_size * sequence_length / seconds


def model_flops_utilization(tokens_per_s: float, config, sequence_length: int, peak: float | None) -> float | None:
    """The job's share of its GPUs' peak: FLOPs per second over ``peak`` times every GPU (dp·cp·tp·pp)."""
    if peak is None:
        return None
    return tokens_per_s * flops_per_token(config.model, sequence_length) / (peak * config.world_size)


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, log_interval: int = 1) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.log_interval = log_interval
        self.source_names: dict[str, str] = {}  # folder → its TensorBoard and W&B name (short_names)
        self.train_steps: int | None = None  # the console's `step N/TOTAL`
        self.wandb = None  # a runtime.observe.wandb_logger.WandbLogger once the trainer started one
        # a checkpointing step's row is held from its line until its checkpoint's blocking part is over (``release``)
        self.hold_rows = False
        self._held: list[dict] = []  # the held training row first, then the step's validation and evaluation rows
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:
                self.info("note: TensorBoard events are off: the tensorboard package is not installed "
                          "(pip install -e '.[tensorboard]' in the checkout, or set logging.tensorboard: false)")

    def last_logged_step(self) -> int:
        """The highest step metrics.jsonl holds (0: none), read before ``truncate_after``: the steps W&B got too."""
        return step_log.last_step(self.path) if self.enabled else 0

    def truncate_after(self, step: int) -> None:
        """On every start (``step`` = the resumed step, 0 when fresh): keep one training line and at
        most one validation line (``"val"``) and one evaluation line (``"eval"``) per step ≤ ``step``, the training
        line first.

        A killed run may have logged steps after its checkpoint, or half a line (a torn tail); the
        steps about to be trained again must not appear twice. Rewritten atomically."""
        if self.enabled:  # a step's last line of each kind: its checkpoint's
            step_log.cut_after(self.path, step, kind=lambda row: ("eval" in row, "val" in row))

    def log(self, record: dict, progress: str = "") -> None:
        """A training row: a non-finite loss or gradient norm (a skipped step) is written as null, so the file
        stays JSON, and is left out of TensorBoard and W&B. ``progress``: the console's elapsed time and ETA."""
        if not self.enabled:
            return
        shown = dict(record)
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        if self.hold_rows:
            self._held = [record]
        else:
            self._append(record)
            self._scalars(record)
        if record.get("skipped") == SURGERY_SKIP:
            self.info(f"step {record['step']:>6} | {record['stage']} | skipped by surgery: read, not trained "
                      f"| lr {record['lr']:.3e}")
            return
        if record["step"] % self.log_interval == 0 or record.get("skipped"):
            total = f"/{self.train_steps}" if self.train_steps is not None else ""
            mfu = f" | mfu {100 * record['mfu']:.1f}%" if record.get("mfu") is not None else ""
            why = "a spike" if record.get("skipped") == "spike" else "not finite"
            skipped = f" (skipped: {why}, no update)" if record.get("skipped") else ""
            self.info(f"step {record['step']:>6}{total} | {record['stage']} | loss {shown['loss']:.4f}{skipped} "
                      f"| lr {record['lr']:.3e} "
                      f"| grad_norm {shown['grad_norm']:.3f} | tokens/s {record['tokens_per_s']:,.0f} "
                      f"| data_wait {record['data_wait_ms']:.1f} ms{mfu}{' | ' + progress if progress else ''}")

    def release(self, **extra) -> None:
        """The held row of a checkpointing step, written with ``extra`` (``checkpoint_blocking_s``): after its
        checkpoint is written or staged, before ``latest`` can name it, so a resume never lacks it. The step's
        validation and evaluation rows, held behind it, follow it: the file keeps a step's training row first."""
        self.hold_rows = False
        if not self._held:
            return
        (row, *after), self._held = self._held, []
        for held in ({**row, **extra}, *after):
            self._append(held)
            self._scalars(held)

    def log_validation(self, step: int, stage: str, results: dict[str, dict], lines: list[str],
                       seconds: float | None = None, key: str = "val") -> None:
        """A validation row ``{"step", "stage", "val": {name: {"loss", "ppl", "tokens"}}}``, a log line (ending
        with how long the evaluation took, ``seconds``, when given), and the scalars ``val/NAME/loss`` (and
        ``ppl``, ``tokens``) per dataset, those of a non-finite loss left out (null, as in a training row).
        ``key="eval"``: an evaluation row, ``{"eval": {task: {"acc", "acc_norm", "n"}}}``, the same way."""
        if not self.enabled:
            return
        results = {name: {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()}
                   for name, r in results.items()}
        row = {"step": step, "stage": stage, key: results}
        if self._held:
            self._held.append(row)
        else:
            self._append(row)
            self._scalars(row)
        took = f" | took {duration(seconds)}" if seconds is not None else ""
        self.info(f"{key:<4} {step:>6} | {stage} | " + " | ".join(lines) + took)

    def resend(self, after_step: int) -> None:
        """metrics.jsonl's rows of steps after ``after_step`` to W&B again (what it lost when a start was killed)."""
        if self.wandb is None:
            return
        for row in step_log.read_rows(self.path):
            if row["step"] > after_step:
                self.wandb.log(scalars(row, self.source_names), row["step"])

    def _scalars(self, row: dict) -> None:
        """The row's scalars to TensorBoard and W&B, at its step."""
        if self.tb is None and self.wandb is None:
            return
        values = scalars(row, self.source_names)
        if self.tb is not None:
            for name, value in values.items():
                self.tb.add_scalar(name, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(values, row["step"])

    def _append(self, row: dict) -> None:
        step_log.append_row(self.path, row)

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        try:
            print(message, file=sys.stdout, flush=True)
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            leave_a_closed_terminal()  # the terminal hung up (its SIGHUP is on the way): train on without it

    def close(self, failed: bool = False) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish(failed)
            self.wandb = None
