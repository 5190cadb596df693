"""A training worker: what ``nanoset train`` starts on every rank (also ``torchrun --nproc_per_node=N
runtime/train.py --config cfg.yaml``, or ``python -m runtime.train`` for one process).

Every check (config, data, the checkpoint to resume and the run folder) runs before any process
group, so a mistake is one line printed once; then the trainer trains. On SIGTERM or SIGUSR1 the
run saves a checkpoint after the current step and exits 0, on Ctrl-C the same with status 130;
rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanoset.errors import print_error, report_user_errors  # noqa: E402
from runtime.startup import start_up  # noqa: E402

REPORT_GRACE_S = 20.0


def report_once(error: Exception | str, reporter: bool, reporters_node: bool = True) -> None:
    """Every rank finds the same mistake and the reporter prints it. The other ranks of its node wait for
    torchrun to stop them once the reporter has exited (exiting first gets it killed, maybe before it prints)
    and print the error themselves only if that never happens; ranks of other nodes (whose exit does not stop
    the reporter's node at once) leave the printing to it."""
    if not reporter:
        if not reporters_node:
            return
        time.sleep(REPORT_GRACE_S)
    print_error(str(error))


def report_per_node(message: str) -> None:
    """How a worker started by torchrun reports a user error that every rank raises: each node's first worker
    (``LOCAL_RANK`` 0) says it, once in each node's log. A script of its own (a custom loader) uses it too:
    ``sys.exit(report_user_errors(main, report=report_per_node))``."""
    report_once(message, reporter=int(os.environ.get("LOCAL_RANK", "0")) == 0)


def train(config_path: str) -> int:
    """Start up (a mistake there is said by every node's local rank 0: each node has its own log), then train
    (a mistake found by then, e.g. data changed since the checkpoint, is said by global rank 0)."""
    startup = start_up(config_path)
    from runtime.trainer import Trainer

    trainer = Trainer(startup.config, startup=startup)
    try:
        return report_user_errors(lambda: trainer.train().exit_status, report=lambda message: report_once(
            message, reporter=trainer.is_main, reporters_node=os.environ.get("GROUP_RANK", "0") == "0"))
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="YAML config (see docs/config.md)")
    args = ap.parse_args(argv)
    return report_user_errors(lambda: train(args.config), report=report_per_node)


if __name__ == "__main__":
    sys.exit(main())
