"""Train: ``torchrun --nproc_per_node=N runtime/train.py --config cfg.yaml`` (or ``python -m runtime.train``).

Parse, validate everything (config and data, before any process group), build, train.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nanoset.errors import NanosetError  # noqa: E402
from runtime.config import Config, ConfigError  # noqa: E402
from runtime.data.hf_cache import resolve_stage_folders  # noqa: E402
from runtime.data.plan import DataPlan  # noqa: E402


def prepare(config_path: str) -> tuple[Config, DataPlan]:
    """Load and validate the config and its data; raises a one-line error for any user mistake."""
    config = Config.from_yaml(config_path)
    p = config.parallelism
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if p.tp * p.pp * p.dp != world:
        raise ConfigError(f"{config_path}: parallelism tp {p.tp} × pp {p.pp} × dp {p.dp} = {p.tp * p.pp * p.dp} "
                          f"processes, but {world} were launched; use torchrun --nproc_per_node={p.tp * p.pp * p.dp}")
    return config, DataPlan(config, resolve_stage_folders(config))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="YAML config (see README: config keys)")
    args = ap.parse_args(argv)
    try:
        config, plan = prepare(args.config)
    except (ConfigError, NanosetError, FileNotFoundError, TimeoutError) as e:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"error: {e}", file=sys.stderr)
        return 1
    from runtime.trainer import Trainer

    trainer = Trainer(config, plan=plan)
    try:
        trainer.train()
    except ConfigError as e:  # e.g. a checkpoint that does not fit the config
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
