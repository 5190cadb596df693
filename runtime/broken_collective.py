"""A worker whose collective broke because another worker ended (killed by the out-of-memory killer, crashed, gone
with its node). Its error — gloo's "Connection closed by peer", NCCL's remote error — is a consequence, and its
traceback (some 60 lines per rank) would bury the one line that names the cause.

Under torchrun's agent, which tears the other workers down and reports the one that ended first (``nanoset train``
in one line, plain torchrun in its failure report), such a worker writes its traceback to
``RUN/tracebacks/rank-R.txt``, marks its failure for the agent (``runtime/cli/agent.py``) and exits 1 without a
word; the launcher's line names the file. Anywhere else (one process, a launcher of another kind), and for any
other error (a bug keeps its traceback on the console), nothing changes.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from nanoset.atomic import atomic_write_text
from nanoset.errors import NanosetError
from runtime.cli.agent import ERROR_FILE, mark_broken_collective
from runtime.control.preemption import from_the_store

TRACEBACKS = "tracebacks"  # in the run folder
BROKEN_COLLECTIVE_STATUS = 1
GLOO_TRANSPORT = "gloo/transport/"  # gloo's errors name their source file: its transport is the connection to a peer
SHOWN_CHARS = 300


def broken_collective(error: BaseException) -> bool:
    """Whether ``error``, or an error it came from, is torch.distributed's communication failing: one of its own
    errors (``DistError``: NCCL's, the store's) or gloo's transport."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if from_the_store(cause) or GLOO_TRANSPORT in str(cause):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def traceback_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / TRACEBACKS / f"rank-{rank}.txt"


def leave_quietly(error: BaseException, run_dir: Path, rank: int, step: int) -> bool:
    """For a broken collective under torchrun's agent (of a world of several): its traceback into the run folder and
    the failure marked for the agent; whether both were done (the worker then exits ``BROKEN_COLLECTIVE_STATUS``
    without a word). False for any other error, or where the file or the mark could not be written: the caller
    raises ``error``, its traceback printed as usual."""
    if ERROR_FILE not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2 or not broken_collective(error):
        return False
    path = traceback_path(run_dir, rank)
    text = (f"rank {rank} (pid {os.getpid()}) after step {step}: a collective operation failed, most likely because "
            f"another rank ended first (the launcher's line, or torchrun's report, names it)\n\n"
            + "".join(traceback.format_exception(error)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except (OSError, NanosetError):
        return False
    first_line = (str(error).strip().splitlines() or [""])[0]
    shown = first_line if len(first_line) <= SHOWN_CHARS else first_line[:SHOWN_CHARS] + " …"
    return mark_broken_collective(f"rank {rank}: a collective operation failed after step {step}, most likely because "
                                  f"another rank ended ({type(error).__name__}: {shown}); its traceback: {path}")


def tracebacks_since(run_dir: Path, since: float) -> dict[int, Path]:
    """The broken collectives' tracebacks written into ``run_dir`` from time ``since`` on (by the workers of one
    launch), by rank."""
    found = {}
    for path in (Path(run_dir) / TRACEBACKS).glob("rank-*.txt"):
        rank = path.stem.removeprefix("rank-")
        try:
            if rank.isdigit() and path.stat().st_mtime >= since:
                found[int(rank)] = path
        except OSError:
            continue
    return dict(sorted(found.items()))
