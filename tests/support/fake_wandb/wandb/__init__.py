"""A stand-in for the ``wandb`` package in tests (put its parent folder first on PYTHONPATH): every call the
runtime makes is appended as one JSON line to the file ``FAKE_WANDB_LOG`` names. ``FAKE_WANDB_NO_FORK=1``: a
server that cannot fork (``fork_from`` raises); ``FAKE_WANDB_FAIL_INIT=1``: no network (``init`` raises)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace


def _record(**event) -> None:
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps(event) + "\n")


class Settings:
    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


class Run:
    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.url = None
        self.settings = SimpleNamespace(sync_dir=f"fake/{run_id}")

    def log(self, values: dict, step: int) -> None:
        _record(call="log", id=self.id, step=step, values=values)

    def finish(self, exit_code: int = 0) -> None:
        _record(call="finish", id=self.id, exit_code=exit_code)


def init(**kwargs) -> Run:
    if os.environ.get("FAKE_WANDB_FAIL_INIT") == "1":
        raise ConnectionError("Network error (ConnectTimeout), entering retry loop\nmore detail")
    if "fork_from" in kwargs and os.environ.get("FAKE_WANDB_NO_FORK") == "1":
        raise RuntimeError("fork_from is not supported by this server")
    config = kwargs.pop("config")
    settings = kwargs.pop("settings")
    _record(call="init", kwargs=kwargs, settings=settings.kwargs, parameters=config.get("parameters"),
            forked_from=config.get("forked_from"), train_steps=config["tokens"]["train_steps"])
    return Run(kwargs["id"])
