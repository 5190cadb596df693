"""``nanoset train --config C [--nproc-per-node N] [--check] [torchrun options]``: check once, then launch.

Every check of start-up (config, data, the checkpoint to resume, the run folder) runs here, in the
launching process, before any worker exists: a mistake is one ``error:`` line, not a line per rank
buried under torchrun's failure report. Then torchrun's elastic agent runs in this process
(``torch.distributed.run``) with ``runtime/train.py`` as the workers' entry point; a worker that fails
has said why in its own line, and the launcher adds only what the worker could not say (killed by a
signal), then exits with the worker's status. ``--check`` prints the plan instead of training: per
stage, its steps and datasets, the samples, tokens and epochs each dataset gives it, and what repeats.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

import numpy as np

from nanoset.errors import ConfigError, print_error, report_user_errors
from runtime.config.load import load_config
from runtime.data.order.plan import DataPlan, StagePlan
from runtime.startup import start_up, startup_notes

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "train.py"
# long enough for the workers to finish the step and save after Ctrl-C or SIGTERM (torchrun's default: 30 s)
SHUTDOWN_TIMEOUT_S = "600"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nanoset train", description="Check the run once, then start its workers "
                                 "with torchrun's elastic agent in this process.",
                                 epilog="Other options are torchrun's (--nnodes, --node-rank, --rdzv-endpoint, ...).")
    ap.add_argument("--config", required=True, help="the run's YAML config (docs/config.md)")
    ap.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None,
                    help="worker processes on this node (default: the config's world size / nodes)")
    ap.add_argument("--check", action="store_true", help="check everything and print the plan; train nothing")
    args, torchrun_args = ap.parse_known_args(argv)
    return report_user_errors(lambda: launch(args.config, args.nproc_per_node, args.check, torchrun_args))


def launch(config_path: str, nproc: int | None, check: bool, torchrun_args: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes, run

    parser = get_args_parser()
    known = parser.parse_args([*torchrun_args, str(TRAIN_SCRIPT)])
    _, nodes = parse_min_max_nnodes(known.nnodes)
    config = load_config(config_path)
    if nproc is None:
        if config.world_size % nodes:
            raise ConfigError(f"{config_path}: parallelism {config.parallelism.describe()} do not split over "
                              f"--nnodes {known.nnodes}; give --nproc-per-node")
        nproc = config.world_size // nodes
    try:
        config.parallelism.check_world(nproc * nodes)
    except ConfigError as e:
        raise ConfigError(f"{config_path}: {e}") from None
    startup = start_up(config, world=nproc * nodes, lock=False)
    if check:
        print("\n".join(plan_report(startup.plan) + [f"note: {note}" for note in startup_notes(startup)]))
        return 0
    torchrun = parser.parse_args([*torchrun_args, f"--nproc-per-node={nproc}", str(TRAIN_SCRIPT),
                                  "--config", config_path])
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # failures are said below, once
    try:
        run(torchrun)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode < 0:  # the worker could not say it: a signal (the out-of-memory killer's SIGKILL)
            name = signal.Signals(-failure.exitcode).name
            print_error(f"worker rank {rank} (pid {failure.pid}) was killed by {name}"
                        + (" (out of memory?)" if name == "SIGKILL" else "")
                        + "; rerun the same command to resume from the latest checkpoint")
            return 128 - failure.exitcode
        return failure.exitcode
    except SignalException as e:  # Ctrl-C or SIGTERM to the launcher: the workers saved (they said so)
        return 128 + int(e.sigval)
    return 0


def _weights_shown(part: StagePlan) -> list[str]:
    """Each dataset's weight as the plan shows it; with a schedule, its weights at the part's first and last steps."""
    if part.schedule is None:
        return [f"{w:g}" for w in part.weights]
    first, last = part.schedule.shares(np.array([part.start_step, part.end_step - 1]))
    return [f"{a:g} by schedule" if f"{a:g}" == f"{b:g}" else f"{a:g} → {b:g} by schedule" for a, b in zip(first, last)]


def plan_report(plan: DataPlan) -> list[str]:
    """What each stage (part) trains: its steps, sequence length and global batch, and per dataset the samples,
    tokens and epochs it draws, and whether it repeats samples (more than one epoch by the end of the stage)."""
    lines, named = [], plan.shown_names()
    for part in plan.stages:
        lines.append(f"stage {part.name!r}: steps {part.start_step}-{part.end_step - 1} ({part.num_steps} steps), "
                     f"sequence length {part.sequence_length}, global batch {part.global_batch_size}: "
                     f"{part.num_samples:,} samples, {part.num_samples * part.sequence_length:,} tokens")
        draws = part.blend.draws(part.num_samples)
        for d, weight, offset, n in zip(part.dataset_ids, _weights_shown(part), part.draw_offsets.tolist(),
                                        draws.tolist()):
            w = plan.datasets[d]
            epochs = n / w.num_samples
            end = (offset + n) / w.num_samples
            repeat = f"; repeats: epoch {end:.2f} by the stage's end" if end > 1 else ""
            lines.append(f"  {named[w.folder]} (weight {weight}): {n:,} of its {w.num_samples:,} samples, "
                         f"{n * w.sequence_length:,} tokens, {epochs:.2f} epochs{repeat}")
    return lines
