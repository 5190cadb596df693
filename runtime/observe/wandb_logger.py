"""Weights & Biases (``logging.wandb``, the ``wandb`` extra): global rank 0 logs every metrics.jsonl row under
the names TensorBoard gets (``runtime.observe.metrics.scalars``), the resolved config and the parameter count.

The run's W&B id is kept in ``RUN_DIR/wandb.json``. W&B refuses steps that go backwards, so a start never
resumes into steps W&B already has: a resume at or past the last step logged (a preemption's checkpoint)
continues the same W&B run; one before it (a rewind, a kill after the last checkpoint) starts a new run forked
from it (``fork_from``; where the server cannot fork, a new run naming its parent and step in its config,
``forked_from``). The last step logged is metrics.jsonl's, read before it is truncated: every row W&B gets is
written there first.

W&B buffers what it is given: a killed process loses the steps since W&B last wrote (offline, a whole start's).
So the record also keeps ``synced_step``, the last step of a W&B run that finished (all written); a start takes
the rows after it, up to the resumed step, from metrics.jsonl again (a fork forks at that step), and W&B's
history equals metrics.jsonl whatever W&B lost (a row it has already is dropped by W&B as a step back, the same
values).

W&B is never a reason to stop training: without the package, or when it fails to start or to log, one note
says so and the run goes on (metrics.jsonl keeps every row).
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoset.atomic import atomic_write_text
from nanoset.errors import WriteFailed
from runtime.config.schema import WandbArgs

RECORD = "wandb.json"  # in the run folder: {"run_id", "project", "entity", "synced_step"} of the W&B run
INSTALL_HINT = "pip install -e '.[wandb]' in the checkout, or remove logging.wandb"


@dataclass(frozen=True)
class WandbStart:
    """Which W&B run a start logs to: ``run_id``, continued (``resume``) or new, forked from ``parent`` at
    ``fork_step`` when it goes back; metrics.jsonl's rows after ``replay_after`` are sent to it first."""

    run_id: str
    resume: bool = False
    parent: str | None = None
    fork_step: int | None = None
    replay_after: int = 0
    reason: str = ""  # for a new run beside a record: why the recorded one is not continued


def choose_run(record: dict | None, args: WandbArgs, resumed_step: int, last_logged_step: int,
               new_id: Callable[[], str]) -> WandbStart:
    """The W&B run of a start at ``resumed_step`` (0: fresh) of a run folder whose ``RECORD`` is ``record``
    (None: none) and whose metrics.jsonl ends at ``last_logged_step``."""
    if record is None:
        return WandbStart(new_id())
    if (record.get("project"), record.get("entity")) != (args.project, args.entity):
        return WandbStart(new_id(), reason=f"logging.wandb's project or entity changed since run {record['run_id']} "
                                           f"({record.get('entity') or 'default'}/{record.get('project')})")
    synced = min(int(record.get("synced_step", 0)), resumed_step)  # what W&B surely has of the steps kept
    if resumed_step >= last_logged_step:
        return WandbStart(record["run_id"], resume=True, replay_after=synced)
    return WandbStart(new_id(), parent=record["run_id"], fork_step=synced, replay_after=synced)


def new_run_id() -> str:
    """A W&B run id as W&B makes them: 8 characters of [a-z0-9]."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def read_record(run_dir: Path) -> dict | None:
    try:
        record = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("run_id"), str) else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class WandbLogger:
    """An open W&B run: ``log`` a row's scalars at its step, ``finish`` at the end (then the record's
    ``synced_step`` is the last step logged)."""

    def __init__(self, run: Any, info: Callable[[str], None], record: Path | None = None,
                 replay_after: int = 0) -> None:
        self.run = run
        self.info = info
        self.record = record
        self.replay_after = replay_after  # metrics.jsonl's rows after this step are sent again at the start
        self.last_step = replay_after

    def log(self, values: dict[str, float], step: int) -> None:
        """Values at ``step`` (a training row and its validation row merge into one W&B step)."""
        if self.run is None:
            return
        try:
            self.run.log(values, step=step)
            self.last_step = step
        except Exception as e:  # noqa: BLE001 - W&B never stops a run
            self.info(f"note: W&B logging stopped at step {step} ({_first_line(e)}); training goes on, "
                      f"metrics.jsonl keeps every row")
            self.run = None

    def finish(self, failed: bool = False) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.finish(exit_code=1 if failed else 0)
        except Exception as e:  # noqa: BLE001
            self.info(f"note: W&B could not finish run {run.id} ({_first_line(e)})")
            return
        if self.record is not None:
            record = read_record(self.record.parent)
            if record is not None and record["run_id"] == run.id:
                _write_record(self.record, dict(record, synced_step=self.last_step), self.info)


def start_wandb(args: WandbArgs | None, run_name: str, run_dir: Path, config: dict, resumed_step: int,
                last_logged_step: int, info: Callable[[str], None]) -> WandbLogger | None:
    """The W&B run of this start (global rank 0 only), said in one line; None when W&B is off or fails."""
    if args is None or args.mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:
        info(f"note: W&B logging is off: the wandb package is not installed ({INSTALL_HINT})")
        return None
    start = choose_run(read_record(run_dir), args, resumed_step, last_logged_step, new_run_id)
    folder = Path(args.dir) if args.dir is not None else run_dir
    kwargs = dict(project=args.project, entity=args.entity, name=args.name or run_name, tags=list(args.tags),
                  mode=args.mode, dir=str(folder), id=start.run_id, config=config)
    forked = ""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if start.resume:
            run = wandb.init(**kwargs, resume="allow", settings=_settings(wandb))
        elif start.parent is not None:
            try:
                run = wandb.init(**kwargs, fork_from=f"{start.parent}?_step={start.fork_step}",
                                 settings=_settings(wandb))
                forked = f"run {start.run_id} forked from it at step {start.fork_step}"
            except Exception as e:  # noqa: BLE001 - a server without forking: a new run that names its parent
                kwargs["config"] = dict(config, forked_from={"run": start.parent, "step": start.fork_step})
                run = wandb.init(**kwargs, settings=_settings(wandb))
                forked = (f"run {start.run_id} is a new run naming it and step {start.fork_step} in its config "
                          f"(forked_from; W&B could not fork it: {_first_line(e)})")
        else:
            run = wandb.init(**kwargs, settings=_settings(wandb))
    except Exception as e:  # noqa: BLE001 - no network, a bad key, a full disk: W&B is off, training goes on
        info(f"note: W&B logging is off: wandb.init failed ({_first_line(e)}); training goes on, "
             f"metrics.jsonl keeps every row")
        return None
    _write_record(run_dir / RECORD, {"run_id": run.id, "project": args.project, "entity": args.entity,
                                     "synced_step": start.replay_after}, info)
    where = _where(run, args.mode)
    if resumed_step > start.replay_after:
        where += (f"; steps {start.replay_after + 1}-{resumed_step} sent from metrics.jsonl (W&B may lack them: no "
                  f"W&B run of this folder finished after them)")
    if start.resume:
        info(f"wandb: continuing run {run.id} from step {resumed_step}{where}")
    elif start.parent is not None:
        info(f"wandb: step {resumed_step} goes back from step {last_logged_step} that run {start.parent} has "
             f"(W&B refuses steps that go backwards): {forked}{where}")
    else:
        reason = f" ({start.reason})" if start.reason else ""
        info(f"wandb: new run {run.id}{reason}{where}")
    return WandbLogger(run, info, run_dir / RECORD, start.replay_after)


def _write_record(path: Path, record: dict, info: Callable[[str], None]) -> None:
    try:
        atomic_write_text(path, json.dumps(record) + "\n")
    except (OSError, WriteFailed) as e:  # W&B's record never stops the run
        info(f"note: {path}: not written ({e}); a resume will start a new W&B run")


def _settings(wandb: Any) -> Any:
    """A fresh object for every init (wandb.init keeps what it was given in it). W&B's own banner lines and its
    capture of the console are off: the run says its one line, and the console stays the trainer's."""
    return wandb.Settings(silent=True, console="off")


def _where(run: Any, mode: str) -> str:
    if mode == "offline":
        sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
        return f"; offline: upload with `wandb sync {sync_dir}`" if sync_dir else "; offline"
    url = getattr(run, "url", None)
    return f": {url}" if url else ""
