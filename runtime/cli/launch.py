"""``nanoset train --config C [--nproc-per-node N] [--check] [torchrun options]``: check once, then launch.

Every check of start-up (config, data, the checkpoint to resume, the run folder) runs here, in the
launching process, before any worker exists: a mistake is one ``error:`` line, not a line per rank
buried under torchrun's failure report. Then torchrun's elastic agent runs in this process
(``torch.distributed.run``, with the launcher's signal handling: ``runtime/cli/agent.py``) with
``runtime/train.py`` as the workers' entry point; a worker that fails has said why in its own line, and
the launcher adds only what the worker could not say (killed by a signal; the workers whose collective broke
with it left their tracebacks in the run folder: ``runtime/broken_collective.py``), then exits with the
worker's status. ``--check`` prints the plan instead of training: where the run starts (a resume, a rewind, a
fresh start), per stage its steps and datasets, the samples, tokens and epochs each dataset gives it, and
what repeats.

The command line is checked before anything else: options are nanoset train's and torchrun's, nothing
else — no script (the launcher runs ``runtime/train.py`` itself), no option that would change the entry
point, one number of nodes — each mistake one ``error:`` line (status 2, as for the other commands).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nanoset.errors import ConfigError, NanosetError, killed_by, print_error, report_user_errors
from runtime.cli.agent import LauncherSignals
from runtime.config.overrides import add_set_option
from runtime.control.preemption import (
    INTERRUPTED_TWICE,
    LAUNCHER_PID,
    STOP_SIGNALS,
    StopRequested,
    stop_status,
    stopped_in_startup,
)

if TYPE_CHECKING:
    from runtime.data.order.plan import DataPlan, StagePlan
    from runtime.startup import Startup

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "train.py"
# torchrun kills workers this long after forwarding a signal it handles itself (its default: 30 s); the launcher
# handles the stop signals on its own and never kills a stopping worker, but keeps it for the signals it leaves
SHUTDOWN_TIMEOUT_S = "600"
# torchrun options that would run something else than runtime/train.py
ENTRY_POINT_OPTIONS = {"module": "-m/--module", "no_python": "--no-python", "run_path": "--run-path"}
# torchrun's own log lines (an OMP_NUM_THREADS banner, "Received 2 death signal", its failure report): the
# launcher says a failure once, itself
TORCHRUN_LOGGERS = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
USAGE_STATUS = 2



class UsageError(NanosetError):
    """A command line nanoset train cannot run: one ``error:`` line, status 2."""


def _refuse(message: str) -> None:
    raise UsageError(f"nanoset train: {message} (see nanoset train --help)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage and exit(2) → one line
        _refuse(message)


@dataclass
class LaunchArgs:
    config: str
    nproc: int | None  # --nproc-per-node; None: the config's world size / nodes
    check: bool
    torchrun: list[str]  # torchrun's options, checked
    nodes: int
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE, in order: the workers get them too
    rewind_to: int | None = None  # --rewind-to STEP: data surgery (runtime/cli/rewind.py)
    skip_steps: list[str] = field(default_factory=list)  # --skip-steps A:B, repeated
    exclude_documents: str | None = None  # --exclude-documents FILE


def parse_args(argv: list[str]) -> LaunchArgs:
    """nanoset train's options and torchrun's, each mistake a ``UsageError``: an unknown option, a positional
    argument (the launcher runs runtime/train.py itself), an option that changes the entry point, a number of
    processes or nodes that is not a positive integer, an elastic range of nodes."""
    ap = _Parser(prog="nanoset train", description="Check the run once, then start its workers with torchrun's "
                 "elastic agent in this process.",
                 epilog="Other options are torchrun's (--nnodes, --node-rank, --rdzv-endpoint, --max-restarts, ...); "
                        "no script: runtime/train.py is the workers' entry point.")
    ap.add_argument("--config", required=True, help="the run's YAML config (docs/config.md)")
    ap.add_argument("--nproc-per-node", "--nproc_per_node", type=_positive("--nproc-per-node"), default=None,
                    help="worker processes on this node (default: the config's world size / nodes)")
    ap.add_argument("--check", action="store_true", help="check everything and print the plan; train nothing")
    ap.add_argument("--rewind-to", type=int, metavar="STEP", help="data surgery: rewind to the checkpoint of STEP, "
                    "record the surgery, train on (docs/data-order.md#data-surgery)")
    ap.add_argument("--skip-steps", action="append", default=[], metavar="A:B",
                    help="with --rewind-to: steps A to B (both included) are read, not trained (repeatable)")
    ap.add_argument("--exclude-documents", metavar="FILE", help="with --rewind-to: FOLDER:DOC lines excised from "
                    "step STEP + 1 on")
    add_set_option(ap)
    args, rest = ap.parse_known_args(argv)
    if (args.skip_steps or args.exclude_documents) and args.rewind_to is None:
        _refuse("--skip-steps and --exclude-documents go with --rewind-to STEP (the checkpoint the surgery starts "
                "after)")
    surgery = {"rewind_to": args.rewind_to, "skip_steps": args.skip_steps, "exclude_documents": args.exclude_documents}
    if not rest:  # nothing of torchrun's to check: torch is not imported for it (a finished run answers at once)
        return LaunchArgs(args.config, args.nproc_per_node, args.check, [], 1, args.overrides, **surgery)
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.error = lambda message: _refuse(_with_closest(message, [*ap._option_string_actions,  # type: ignore
                                                                   *parser._option_string_actions]))
    known = parser.parse_args([*rest, "--", str(TRAIN_SCRIPT)])
    for option, spelled in ENTRY_POINT_OPTIONS.items():
        if getattr(known, option, False):
            _refuse(f"{spelled} is not for nanoset train, whose workers run runtime/train.py")
    if known.training_script != str(TRAIN_SCRIPT) or known.training_script_args:
        given = known.training_script
        if Path(given).name == TRAIN_SCRIPT.name:
            _refuse(f"takes no script: it runs runtime/train.py itself; drop {given!r} from the command")
        _refuse(f"takes no positional argument ({given!r}): it runs runtime/train.py with --config")
    return LaunchArgs(args.config, args.nproc_per_node, args.check, rest, _nodes(known.nnodes), args.overrides,
                      **surgery)


def _with_closest(message: str, options: list[str]) -> str:
    """argparse's "unrecognized arguments: --chek" with the closest option of nanoset train or torchrun (a typo's
    fix), when one is close."""
    given = message.removeprefix("unrecognized arguments: ")
    if given == message:
        return message
    for word in given.split():
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=")[0], [o for o in options if o.startswith("--")], n=1)
            if close:
                return f"{message}; did you mean {close[0]}?"
    return message


def _positive(option: str):
    def parse(value: str) -> int:
        if not re.fullmatch(r"\d+", value.strip()) or int(value) < 1:
            raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of processes")
        return int(value)
    return parse


def _nodes(nnodes: str) -> int:
    """``--nnodes N`` (or ``N:N``): the config's parallelism fixes the number of processes, so one number."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", str(nnodes))
    if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
        _refuse(f"--nnodes {nnodes!r}: give a positive number of nodes")
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if low != high:
        _refuse(f"--nnodes {nnodes}: the config's parallelism fixes the number of processes, so the number of "
                f"nodes too; give one number (--nnodes {high})")
    return high


def main(argv: list[str] | None = None) -> int:
    signals = LauncherSignals().install()  # before anything slow: every stop signal has one answer from here
    try:
        try:
            args = parse_args(list(sys.argv[1:] if argv is None else argv))
        except UsageError as e:
            print_error(str(e))
            return USAGE_STATUS
        return report_user_errors(lambda: launch(args, signals))
    except StopRequested as e:  # before any worker ran: nothing to save
        print(stopped_in_startup(e.name), file=sys.stderr, flush=True)
        return stop_status(e.signum)
    except ImportError as e:
        if e.name is None or e.name.split(".")[0] != "torch":
            raise
        from nanoset.errors import NEEDS_TORCH

        print_error(f"nanoset train {NEEDS_TORCH}")
        return 1


def workers_per_node(config, config_path: str, nproc: int | None, nodes: int) -> int:
    """The processes to start on this node: ``--nproc-per-node``, or the config's world size / nodes."""
    world, layout = config.world_size, config.parallelism.describe()
    if nproc is None:
        if world % nodes:
            raise ConfigError(f"{config_path}: parallelism {layout} do not split over --nnodes {nodes}; change "
                              f"parallelism or --nnodes")
        return world // nodes
    if nproc * nodes != world:
        fix = (f"give --nproc-per-node {world // nodes} or leave it out" if world % nodes == 0
               else "change parallelism or --nnodes")
        on = f" on --nnodes {nodes}" if nodes > 1 else ""
        raise ConfigError(f"{config_path}: parallelism {layout}, but --nproc-per-node {nproc}{on} would start "
                          f"{nproc * nodes}; {fix}")
    return nproc


def launch(args: LaunchArgs, signals: LauncherSignals) -> int:
    import torch  # noqa: F401 - the workers need it: without it the run is one line saying so, before any other check

    from runtime.config.load import read_config
    from runtime.stage_optimizer import StageOptimizers
    from runtime.startup import describe_start, start_up, startup_notes, startup_warnings

    config, changes = read_config(args.config, args.overrides)
    rewinding = None
    if args.rewind_to is not None:  # the launcher's checks resume what the rewind will
        from runtime.cli.rewind import plan_rewind, rewind_entry

        rewinding = plan_rewind(config, rewind_entry(args.rewind_to, args.skip_steps, args.exclude_documents,
                                                     config.tokens.train_steps))
        before = config.checkpoints.resume  # the config is read once: the rewind sets where it resumes
        config.checkpoints = replace(config.checkpoints, resume=rewinding.resume)
        changes.append(f"checkpoints.resume: {'null' if before is None else before} → {rewinding.resume}")
    nproc = workers_per_node(config, args.config, args.nproc, args.nodes)
    pending = rewinding.entry if rewinding is not None and rewinding.checkpoint is not None else None
    startup = start_up(config, world=nproc * args.nodes, lock=False, pending=pending)
    if args.check:
        given = changes[:len(args.overrides)]  # not the checkpoints.resume a rewind adds
        print("\n".join([*(f"--set {change}" for change in given), f"start: {describe_start(startup)}",
                         *surgery_report(startup.plan), *plan_report(startup.plan),
                         *StageOptimizers(config).describe(),
                         *(f"warning: {warning}" for warning in startup_warnings(startup)),
                         *(f"note: {note}" for note in startup_notes(startup))]))
        return 0
    if rewinding is not None:
        from runtime.cli.rewind import carry_out

        print(carry_out(config, rewinding), flush=True)
        args.overrides = [*args.overrides, "checkpoints.resume=latest"]  # the workers resume what was rewound to
    finished = finished_run(startup)
    if finished is not None:  # the workers would start, load the checkpoint and say just this
        print(finished, flush=True)
        return 0
    return run_workers(args, nproc, signals, config.general.run_path)


def finished_run(startup: Startup) -> str | None:
    """The line for a run whose checkpoint is already at ``tokens.train_steps`` (a rerun of a finished run), said
    before any worker starts; None when there is something to train."""
    c, start = startup.config, startup.start
    if start.checkpoint is None or start.record.last_step < c.tokens.train_steps:
        return None
    return (f"done: {start.checkpoint} is at step {start.record.last_step} = tokens.train_steps: nothing left to "
            f"train, no worker started (raise tokens.train_steps to train on)")


def run_workers(args: LaunchArgs, nproc: int, signals: LauncherSignals, run_dir: Path) -> int:
    """torchrun's elastic agent, in this process, with runtime/train.py on ``nproc`` workers; their status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import get_args_parser, run

    from runtime.broken_collective import tracebacks_since
    from runtime.cli.agent import agent_of_launch, failure_message, is_broken_collective, root_failure

    overrides = [word for text in args.overrides for word in ("--set", text)]  # the workers build the same config
    torchrun = get_args_parser().parse_args([*args.torchrun, f"--nproc-per-node={nproc}", "--", str(TRAIN_SCRIPT),
                                             "--config", args.config, *overrides])
    if hasattr(torchrun, "signals_to_handle"):  # torch ≥ 2.8: leave the stop signals to the launcher's handlers
        ours = {s.name for s in STOP_SIGNALS}
        torchrun.signals_to_handle = ",".join(
            s for s in torchrun.signals_to_handle.split(",") if s.strip() and s.strip() not in ours) or "SIGQUIT"
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the workers stop if this process goes (runtime/control/preemption.py)
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)
    if nproc > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets, without its five-line banner
    quiet_torchrun()
    started = time.time()
    try:
        with agent_of_launch(signals):
            run(torchrun)
    except ChildFailedError as e:
        if signals.killed:
            print_error(INTERRUPTED_TWICE)
            return stop_status(signal.SIGINT)
        rank, failure = root_failure(e.failures)
        if failure.exitcode < 0:  # the worker could not say it: a signal (the out-of-memory killer's SIGKILL)
            print_error(f"worker rank {rank} (pid {failure.pid}) was {killed_by(-failure.exitcode)}"
                        f"{ended_with_it(tracebacks_since(run_dir, started))}; rerun the same command to resume from "
                        f"the latest checkpoint")
            return 128 - failure.exitcode
        if is_broken_collective(failure.error_file_data):  # only broken collectives: a peer hung, a network broke
            print_error(f"worker {failure_message(failure.error_file_data)}")
        return failure.exitcode
    except RendezvousError as e:  # the nodes never met: an endpoint, a node not started, a firewall
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__  # a timeout says nothing more
        raise NanosetError(f"the rendezvous of the nodes failed ({why}); check --rdzv-endpoint "
                           f"{torchrun.rdzv_endpoint or '(none)'} and that every node runs the same command") from None
    return 0


def ended_with_it(tracebacks: dict[int, Path]) -> str:
    """The ranks whose collective broke when a worker was killed, and where their tracebacks are."""
    if not tracebacks:
        return ""
    if len(tracebacks) == 1:
        ((rank, path),) = tracebacks.items()
        return f"; rank {rank} ended with it (its broken collective's traceback: {path})"
    folder = next(iter(tracebacks.values())).parent
    return (f"; ranks {', '.join(map(str, tracebacks))} ended with it (their broken collectives' tracebacks: "
            f"{folder})")


def quiet_torchrun() -> None:
    """torch's elastic loggers each set their own level, so a parent's level does not hold them: their records
    end at a handler that drops them instead of Python's last-resort printer."""
    for name in TORCHRUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = False


def surgery_report(plan: DataPlan) -> list[str]:
    """The surgery in force, for ``--check``: the steps skipped, the documents excised, and per stage part the
    documents and samples its draws pass over."""
    if not plan.surgery:
        return []
    lines, named = [f"surgery: {line}" for line in plan.surgery.describe()], plan.shown_names()
    for part in plan.stages:
        skipped = plan.surgery.skipped_in(part.start_step, part.end_step - 1)
        if skipped:
            lines.append(f"surgery: stage {part.name!r}: {len(skipped)} step(s) skipped")
        for d, documents, passed in plan.passed_over(part):
            lines.append(f"surgery: stage {part.name!r}: {named[plan.datasets[d].folder]}: {documents} document(s) "
                         f"excluded, {passed:,} sample(s) passed over")
    return lines


def plan_report(plan: DataPlan) -> list[str]:
    """What each stage (part) trains: its steps, sequence length and global batch, and per dataset the samples,
    tokens and epochs it draws, and whether it repeats samples (more than one epoch by the end of the stage)."""
    lines, named = [], plan.shown_names()
    for part in plan.stages:
        lines.append(f"stage {part.name!r}: steps {part.start_step}-{part.end_step - 1} ({part.num_steps} steps), "
                     f"sequence length {part.sequence_length}, global batch {part.global_batch_size}: "
                     f"{part.num_samples:,} samples, {part.num_samples * part.sequence_length:,} tokens")
        for reads, weight in zip(plan.reads(part), part.weights_shown()):
            w = plan.datasets[reads.dataset]
            repeat = f"; repeats: epoch {reads.end_epoch:.2f} by the stage's end" if reads.repeats else ""
            padding = f" ({100 * w.padding_share:.1f}% of them padding)" if w.packing == "documents" else ""
            lines.append(f"  {named[w.folder]} (weight {weight}): {reads.samples:,} of its {w.num_samples:,} "
                         f"samples, {reads.samples * w.sequence_length:,} tokens{padding}, {reads.epochs:.2f} "
                         f"epochs{repeat}")
        if part.adaptive is not None:
            lines.append(adaptive_report(plan, part))
    return lines


def adaptive_report(plan: DataPlan, part: StagePlan) -> str:
    """An adaptive part in one line: its rule and block, what is decided, the run's last decision and where every
    decision is (the log)."""
    from runtime.observe.mixing_log import log_path, read_rows

    a, blend = part.adaptive, part.blend
    decided = part.start_step + blend.decided_steps - 1
    line = (f"  adaptive ({a['rule']}, every {a['every']}): samples above are of the decided steps "
            f"{part.start_step}-{decided}")
    path = log_path(plan.config.general.run_path)
    last = [r for r in read_rows(path) if r["stage"] == part.name]
    if not last:
        return line + "; no decision logged yet"
    r = last[-1]
    weights = ", ".join(f"{w:.4f}" for w in r["weights"])
    return (line + f"; last decision at step {r['step']} (block {r['block']} → block {r['decides_block']}, steps "
            f"{r['steps'][0]}-{r['steps'][1]}): [{weights}]; every decision: {path}")
