"""Tokenize jobs sharing one output folder: a second job on the tasks (or the folder) another is writing is
refused in one line naming it (the first died with "... was removed while this run wrote it"), a killed job
never locks its rerun out, and the task-index runs of one job still run side by side."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from nanoset import open_dataset
from tests.support import TOKENIZER, one_line_error, run_cli

# `nanoset ARGS` that stops before marking its first task done until the file GO exists (RUNNING says it is there)
HELD = """
import sys, time
from pathlib import Path
from nanoset import cli
from nanoset.tokenize.tasks import OutputFolder

signals, real = Path(sys.argv[1]), OutputFolder.mark_done

def held(self, task, result):
    (signals / "RUNNING").touch()
    while not (signals / "GO").exists():
        time.sleep(0.02)
    real(self, task, result)

OutputFolder.mark_done = held
sys.argv = ["nanoset", *sys.argv[2:]]
cli.main()
"""


def corpus(folder: Path) -> Path:
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"alpha beta {i}"}) + "\n" for i in range(120)))
    return folder


def args(data: Path, out: Path, *extra) -> list[str]:
    return ["tokenize", str(data), "-o", str(out), "--tokenizer", str(TOKENIZER), "--quiet", "--task-bytes", "800",
            *map(str, extra)]


class Held:
    """A tokenize job stopped while it writes (before its first task's marker), until ``go``."""

    def __init__(self, tmp_path: Path, cli_args: list[str]) -> None:
        self.signals = tmp_path / f"signals-{time.monotonic_ns()}"
        self.signals.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-c", HELD, str(self.signals), *cli_args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (self.signals / "RUNNING").exists():
            assert self.proc.poll() is None and time.time() < deadline, self.proc.communicate()
            time.sleep(0.02)

    def go(self) -> str:
        (self.signals / "GO").touch()
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err
        return out


def test_a_second_job_on_a_folder_being_written_is_refused_naming_the_first(tmp_path):
    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    share = ["--num-tasks", 2, "--task-index", 0]
    first = Held(tmp_path, args(data, out, *share))
    refused = (f"error: {out}: another `nanoset tokenize` (host {socket.gethostname()}, pid {first.proc.pid}, "
               f"--task-index 0 of 2) is writing")
    one_line_error(run_cli(*args(data, out, *share), check=False),
                   f"{refused} these tasks of this folder; wait for it to end or stop it (a rerun resumes), and give "
                   f"each machine of one job its own --task-index")
    emptying = (f"{refused} this folder; it cannot be emptied (--overwrite, or a job of other options) while that "
                f"one runs: wait for it to end or stop it, or choose another output folder")
    other_share = ["--num-tasks", 2, "--task-index", 1]
    for replacing in (["--max-tokens-per-shard", 50], ["--max-tokens-per-shard", 50, "--overwrite"]):
        one_line_error(run_cli(*args(data, out, *replacing, *other_share), check=False), emptying)
    assert "; partial: other task indices still to run" in first.go()
    assert "; complete" in run_cli(*args(data, out, *other_share)).stdout
    assert open_dataset(out).num_documents == 120
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the lock file went with the job


def test_a_killed_job_does_not_lock_its_rerun_out(tmp_path):
    data = corpus(tmp_path / "data")
    out = tmp_path / "out"
    first = Held(tmp_path, args(data, out))
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)
    assert (out / ".nanoset-work.lock").is_file()  # the killed job's file: its locks went with it
    assert "; complete" in run_cli(*args(data, out)).stdout
    assert open_dataset(out).num_documents == 120


def test_the_task_indices_of_one_job_run_side_by_side(tmp_path):
    data = corpus(tmp_path / "data")
    out, alone = tmp_path / "out", tmp_path / "alone"
    first = Held(tmp_path, args(data, out, "--num-tasks", 2, "--task-index", 0))
    second = run_cli(*args(data, out, "--num-tasks", 2, "--task-index", 1))
    assert "; partial: other task indices still to run" in second.stdout
    # every task at once beside them overlaps both: refused, naming one of them
    one_line_error(run_cli(*args(data, out), check=False), f"error: {out}: another `nanoset tokenize` (host "
                   f"{socket.gethostname()}, pid {first.proc.pid}, --task-index 0 of 2) is writing these tasks")
    assert "; complete" in first.go()
    run_cli(*args(data, alone))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in alone.iterdir()}


def test_a_filesystem_without_locks_runs_the_job_with_a_note(tmp_path, monkeypatch, capsys):
    """ENOSYS (Lustre mounted without flock) is no other job holding the folder: refusing would stop every job
    there, so it runs as it did before the lock, and says so."""
    import errno
    import fcntl

    from nanoset.tokenize.job import TokenizeOptions, tokenize

    def no_locks(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    out = tmp_path / "out"
    summary = tokenize(TokenizeOptions(inputs=[str(corpus(tmp_path / "data"))], output=out, tokenizer=str(TOKENIZER),
                                       progress=False))
    assert summary.complete and summary.documents == 120
    assert capsys.readouterr().err == (f"note: {out}: no file locks here (Function not implemented): nothing keeps "
                                       f"two tokenize jobs from writing this folder at once; run one at a time (one "
                                       f"per --task-index)\n")
