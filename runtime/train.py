"""A training worker: what ``nanoset train`` starts on every rank (also ``torchrun --nproc_per_node=N
runtime/train.py --config cfg.yaml``, or ``python -m runtime.train`` for one process).

Every check (config, data, the checkpoint to resume and the run folder) runs before any process
group, so a mistake is one line printed once; then the trainer trains. The stop signals are answered
from the first line on (``runtime/control/preemption.py``): during start-up they end the worker at once with one
line; while training, on SIGTERM, SIGUSR1, SIGHUP or Ctrl-C the run saves a checkpoint after the current
step and exits 128 + the signal; rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# light imports only before main() installs the stop handlers (preemption takes the launcher's pid at import)
from nanoset.errors import print_error, report_user_errors  # noqa: E402
from runtime.cli.agent import mark_user_error  # noqa: E402
from runtime.control.preemption import (  # noqa: E402
    PARENT_AT_START,
    STOP_SIGNALS,
    STORE_GRACE_S,
    StopOnSignal,
    StopRequested,
    from_the_store,
    ignore_stop_signals,
    stop_status,
    stopped_in_startup,
)

REPORT_GRACE_S = 20.0


def report_once(error: Exception | str, reporter: bool, reporters_node: bool = True) -> None:
    """Every rank finds the same mistake and the reporter prints it. The other ranks of its node wait for
    torchrun to stop them once the reporter has exited (exiting first gets it killed, maybe before it prints)
    and print the error themselves only if that never happens; ranks of other nodes (whose exit does not stop
    the reporter's node at once) leave the printing to it. Every rank marks the error for its launcher, which
    does not restart a mistake."""
    mark_user_error(str(error))
    if not reporter:
        if not reporters_node:
            return
        for sig in STOP_SIGNALS:  # torchrun's SIGTERM is the expected end here: no "stopped by" line for it
            signal.signal(sig, signal.SIG_DFL)
        time.sleep(REPORT_GRACE_S)
    print_error(str(error))


def report_per_node(message: str) -> None:
    """How a worker started by torchrun reports a user error that every rank raises: each node's first worker
    (``LOCAL_RANK`` 0) says it, once in each node's log. A script of its own (a custom loader) uses it too:
    ``sys.exit(report_user_errors(main, report=report_per_node))``."""
    report_once(message, reporter=int(os.environ.get("LOCAL_RANK", "0")) == 0)


def train(config_path: str, overrides: list[str] | None = None) -> int:
    """Start up (a mistake there is said by every node's local rank 0: each node has its own log), then train
    (a mistake found by then, e.g. data changed since the checkpoint, is said by global rank 0; a collective that
    another rank's end broke leaves its traceback in the run folder, said by the launcher). ``overrides``:
    ``--set KEY=VALUE``, applied to the file as ``nanoset train`` applied them."""
    from runtime.config.load import load_config
    from runtime.startup import start_up

    startup = start_up(load_config(config_path, overrides) if overrides else config_path)
    from runtime.broken_collective import BROKEN_COLLECTIVE_STATUS, leave_quietly
    from runtime.trainer import Trainer

    trainer = Trainer(startup.config, startup=startup)
    try:
        return report_user_errors(lambda: trainer.run().exit_status, report=lambda message: report_once(
            message, reporter=trainer.is_main, reporters_node=os.environ.get("GROUP_RANK", "0") == "0"))
    except Exception as e:
        if not leave_quietly(e, trainer.run_dir, trainer.parallel_context.world_rank, trainer.last_step):
            raise
        return BROKEN_COLLECTIVE_STATUS
    finally:
        trainer.close()


def stopped_before_training(signum: int) -> int:
    """A stop during start-up: said once per node (by its first worker), then 128 + the signal."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(stopped_in_startup(signal.Signals(signum).name), file=sys.stderr, flush=True)
    return stop_status(signum)


def main(argv: list[str] | None = None) -> int:
    stop = StopOnSignal(PARENT_AT_START)
    try:
        stop.install()  # inside: a stop forwarded the moment the handlers are in place is a StopRequested here
        from runtime.config.overrides import add_set_option

        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        ap.add_argument("--config", required=True, help="YAML config (see docs/config.md)")
        add_set_option(ap)
        args = ap.parse_args(argv)
        return report_user_errors(lambda: train(args.config, args.overrides), report=report_per_node)
    except StopRequested as e:
        return stopped_before_training(e.signum)
    except Exception as e:
        if stop.phase != "start-up":
            raise
        if stop.signum is not None:  # e.g. a collective broken by a rank that stopped first
            return stopped_before_training(stop.signum)
        stop.end_if_launcher_lost(within_s=STORE_GRACE_S if from_the_store(e) else 0.0)  # its store went with it
        raise


if __name__ == "__main__":
    status = main()
    ignore_stop_signals()
    sys.exit(status)
