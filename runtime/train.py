"""Train: ``torchrun --nproc_per_node=N runtime/train.py --config cfg.yaml`` (or ``python -m runtime.train``).

Parse, validate everything (config, data, the checkpoint to resume and the run folder) before any
process group, so a mistake is one line printed once; build, train. On SIGTERM or SIGUSR1 the run
saves a checkpoint after the current step and exits 0; rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanoset.errors import NanosetError  # noqa: E402
from runtime.config import Config, ConfigError  # noqa: E402
from runtime.config.load import load_config
from runtime.data.heldout import open_heldout, training_tokenizers  # noqa: E402
from runtime.data.hf_cache import resolve_stage_folders  # noqa: E402
from runtime.data.order.plan import DataPlan  # noqa: E402
from runtime.hf.preflight import check_init_from_hf  # noqa: E402
from runtime.run_start import RunStart, plan_start  # noqa: E402

REPORT_GRACE_S = 20.0
USER_ERRORS = (ConfigError, NanosetError, FileNotFoundError, TimeoutError)


def prepare(config_path: str) -> tuple[Config, DataPlan, RunStart]:
    """Load and validate the config, its data and where the run starts; one-line errors for user mistakes."""
    config = load_config(config_path)
    p = config.parallelism
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if p.tp * p.pp * p.dp != world:
        raise ConfigError(f"{config_path}: parallelism tp {p.tp} × pp {p.pp} × dp {p.dp} = {p.tp * p.pp * p.dp} "
                          f"processes, but {world} were launched; use torchrun --nproc_per_node={p.tp * p.pp * p.dp}")
    start = plan_start(config)
    plan = DataPlan(config, resolve_stage_folders(config)).resumed_from(start.checkpoint, start.metadata)
    check_init_from_hf(config, plan, fresh_start=start.checkpoint is None)
    return config, plan, start


def report_once(error: Exception, reporter: bool, reporters_node: bool = True) -> None:
    """Every rank finds the same mistake and the reporter prints it. The other ranks of its node wait for
    torchrun to stop them once the reporter has exited (exiting first gets it killed, maybe before it prints)
    and print the error themselves only if that never happens; ranks of other nodes (whose exit does not stop
    the reporter's node at once) leave the printing to it."""
    if not reporter:
        if not reporters_node:
            return
        time.sleep(REPORT_GRACE_S)
    print(f"error: {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="YAML config (see README: config keys)")
    args = ap.parse_args(argv)
    try:
        config, plan, start = prepare(args.config)
        heldout = open_heldout(config, training_tokenizers(plan))  # validation data, checked before start-up
    except USER_ERRORS as e:  # before start-up: printed once per node (each node has its own log)
        report_once(e, reporter=int(os.environ.get("LOCAL_RANK", "0")) == 0)
        return 1
    from runtime.trainer import Trainer

    trainer = Trainer(config, plan=plan, start=start, heldout=heldout)
    try:
        trainer.train()
    except USER_ERRORS as e:  # found after start-up (e.g. data that changed since the checkpoint)
        report_once(e, reporter=trainer.is_main, reporters_node=os.environ.get("GROUP_RANK", "0") == "0")
        return 1
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
