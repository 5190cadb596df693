"""Tokenize at scale: bounded task counts, a killed worker, several machines on one output folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nanoset.tokenize.inputs import Source, discover
from nanoset.tokenize.tasks import auto_task_bytes, make_plan
from tests.support import CORPUS, TOKENIZER, run_cli
from tests.support.datasets import big_corpus, same_folder


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "nanoset.cli", *map(str, args)]


def run_with_timeout(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a CLI command in its own process group; on timeout kill the whole group and fail."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{args[3:]} still running after {timeout}s: it hangs")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


# ---------------------------------------------------------------- task size from the corpus size ----


@pytest.mark.parametrize("sizes", [
    [10**9] * 1000,                 # 1 TB in 1 GB files
    [10**7] * 100_000,              # 1 TB in 10 MB files
    [3 * 10**11, 7 * 10**11],       # 1 TB in two huge files
    [2**31] * 466,                  # just over 1 TB in 2 GiB files
])
def test_default_plan_of_a_terabyte_has_at_most_2000_tasks(sizes):
    sources = [Source(f"/corpus/part-{i:06d}.jsonl", "jsonl", size, 0) for i, size in enumerate(sizes)]
    plan = make_plan(sources, {})
    assert plan.build["task_bytes"] == auto_task_bytes(sum(sizes)) == 1 << 29
    assert 900 <= len(plan.tasks) <= 2000
    assert sum(p.weight for t in plan.tasks for p in t.pieces) == sum(sizes)


def test_auto_task_bytes_rule():
    assert auto_task_bytes(0) == auto_task_bytes(1) == auto_task_bytes(4 << 20) == 64 << 10
    assert auto_task_bytes(10 << 20) == 256 << 10  # a small corpus: 40 tasks for many workers
    assert auto_task_bytes(64 << 20) == auto_task_bytes(1 << 30) == 1 << 20
    for total in [1, 999, 5 << 20, 3 * 10**8, 7 * 10**10, 10**12, 10**15]:
        size = auto_task_bytes(total)
        assert size & (size - 1) == 0 and size >= 64 << 10
        assert -(-total // size) <= 2000
        assert -(-total // size) >= min(32, -(-total // (64 << 10)))


def test_small_corpus_default_plan_has_many_tasks_and_same_bytes_for_any_workers(tmp_path):
    plan = make_plan(discover([str(CORPUS)]), {})
    assert plan.build["task_bytes"] == 64 << 10 and len(plan.tasks) >= 12
    base = ["tokenize", CORPUS, "--tokenizer", TOKENIZER, "--quiet"]
    run_cli(*base, "-o", tmp_path / "one")
    meta = json.loads((tmp_path / "one" / "nanoset.json").read_text())
    assert meta["build"]["task_bytes"] == 64 << 10 and len(meta["shards"]) == len(plan.tasks)
    run_cli(*base, "-o", tmp_path / "three", "--workers", 3)
    assert same_folder(tmp_path / "one", tmp_path / "three")
    run_cli(*base, "-o", tmp_path / "split", "--num-tasks", 2, "--task-index", 1, "--workers", 2)
    run_cli(*base, "-o", tmp_path / "split", "--num-tasks", 2, "--task-index", 0)
    assert same_folder(tmp_path / "one", tmp_path / "split")


# ---------------------------------------------------------------- a killed worker -------------------


def small_corpus(folder: Path) -> Path:
    return big_corpus(folder, files=4, docs=150, seed=11)


def test_killed_worker_stops_the_job_naming_its_task_and_rerun_resumes(tmp_path):
    from nanoset.tokenize.tasks import describe_task

    corpus = small_corpus(tmp_path / "corpus")
    args = ["--tokenizer", TOKENIZER, "--task-bytes", 40_000, "--quiet"]
    run_cli("tokenize", corpus, "-o", tmp_path / "clean", *args)
    plan = make_plan(discover([str(corpus)]), {}, 40_000)
    assert len(plan.tasks) >= 6
    task = plan.tasks[3]
    first, last = task.pieces
    assert describe_task(task) == (f"{corpus}/part-001.jsonl bytes {first.start}-{first.stop} to "
                                   f"{corpus}/part-002.jsonl bytes 0-{last.stop}, 2 pieces")

    out = tmp_path / "out"
    killed = run_with_timeout(cli("tokenize", corpus, "-o", out, *args, "--workers", 2), timeout=90,
                              env={"NANOSET_FAULT_KILL_TASK": "3"})
    assert killed.returncode == 1, killed.stdout + killed.stderr
    assert killed.stderr.splitlines() == [
        f"error: task 3 ({describe_task(task)}): its worker process was killed by SIGKILL (often the out-of-memory "
        f"killer); the tasks finished so far are kept: rerun the same command to resume "
        f"(with fewer --workers if memory ran out)"]
    assert not (out / "nanoset.json").exists() and not (out / ".nanoset-work" / "task-000003.json").exists()

    rerun = run_with_timeout(cli("tokenize", corpus, "-o", out, *args, "--workers", 2), timeout=90)
    assert rerun.returncode == 0 and "complete" in rerun.stdout, rerun.stderr
    assert same_folder(tmp_path / "clean", out)


def test_error_in_a_worker_is_one_line(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(400)) + "{bad\n")
    proc = run_with_timeout(cli("tokenize", f, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--quiet",
                                "--task-bytes", 20_000, "--workers", 2), timeout=90)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {f}:401: malformed JSON (Expecting property name enclosed in "
                                        f"double quotes at column 2) (pass --skip-bad-lines to skip and count such "
                                        f"lines)"]


# ---------------------------------------------------------------- several machines on one output folder -----


def test_two_machines_at_once_equal_one(tmp_path, fixture_dataset):
    args = ["--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet"]
    for attempt in range(2):
        out = tmp_path / f"shared{attempt}"
        procs = [subprocess.Popen(cli("tokenize", CORPUS, "-o", out, *args, "--num-tasks", 2, "--task-index", i),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in ((0, 1) if attempt == 0 else (1, 0))]
        results = [p.communicate(timeout=180) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], results
        assert any("; complete" in stdout for stdout, _ in results), results
        assert same_folder(fixture_dataset, out)


def test_a_machine_finding_the_job_finished_meanwhile_reports_it_complete(tmp_path, fixture_dataset, monkeypatch):
    """Machine 1 runs its tasks; before it reads the markers, machine 0 reruns, finds every task done, writes
    the manifest and removes the work folder. Machine 1 must then see a complete job (it used to read the
    vanishing markers and fail with AttributeError)."""
    from nanoset.tokenize import job as tokenize_mod
    from nanoset.tokenize.job import TokenizeOptions

    out = tmp_path / "out"
    base = ["tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet"]
    assert "partial" in run_cli(*base, "--num-tasks", 2, "--task-index", 0).stdout
    real = tokenize_mod._run_tasks

    def run_then_other_machine_finishes(*a, **k):
        results = real(*a, **k)
        assert "; complete" in run_cli(*base, "--num-tasks", 2, "--task-index", 0).stdout
        assert not (out / ".nanoset-work").exists()
        return results

    monkeypatch.setattr(tokenize_mod, "_run_tasks", run_then_other_machine_finishes)
    summary = tokenize_mod.tokenize(TokenizeOptions(inputs=[str(CORPUS)], output=out, tokenizer=str(TOKENIZER),
                                                    task_bytes=200_000, num_tasks=2, task_index=1, progress=False))
    assert summary.complete and summary.tasks_run > 0
    assert same_folder(fixture_dataset, out)


@pytest.mark.parametrize("other_starts", ["after our listing", "just before our rename"])
def test_machines_starting_together_share_one_work_folder(tmp_path, monkeypatch, other_starts):
    """Machine A prepares the folder while machine B is preparing it: B must take it as its own (it used to
    see A's half-made work folder as "other files"), and refuse only a different plan."""
    from nanoset.errors import NanosetError
    from nanoset.tokenize.tasks import OutputFolder

    plan = make_plan(discover([str(CORPUS)]), {}, 200_000)
    out = tmp_path / "out"
    a, b = OutputFolder(out), OutputFolder(out)
    hook = "_entries" if other_starts == "after our listing" else "_create_work"
    real = getattr(OutputFolder, hook)

    def other_machine_starts(self, *args):
        if self is b:
            assert a.prepare(plan, False) is False
        return real(self, *args)

    monkeypatch.setattr(OutputFolder, hook, other_machine_starts)
    assert b.prepare(plan, False) is False
    assert [p.name for p in out.iterdir()] == [".nanoset-work"]
    assert (out / ".nanoset-work" / "plan.json").read_text() == plan.state_json()

    monkeypatch.undo()
    other = make_plan(discover([str(CORPUS / "web")]), {}, 200_000)
    with pytest.raises(NanosetError, match="another run is writing a different dataset there"):
        OutputFolder(out)._create_work(other.state_json())
    assert [p.name for p in out.iterdir()] == [".nanoset-work"]


def test_a_manifest_left_half_written_is_removed_when_the_job_finishes(tmp_path, fixture_dataset):
    """Killed while writing nanoset.json: its temporary file stayed in the finished dataset for good."""
    out = tmp_path / "out"
    base = ["tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet"]
    run_cli(*base, "--num-tasks", 2, "--task-index", 0)
    (out / ".nanoset.json.tmp-4242").write_text('{"format": "nano')
    assert "; complete" in run_cli(*base, "--num-tasks", 2, "--task-index", 1).stdout
    assert same_folder(fixture_dataset, out) and not (out / ".nanoset.json.tmp-4242").exists()


def test_two_machines_writing_the_manifest_at_once(tmp_path, fixture_dataset, monkeypatch):
    """Both machines find every task done; the other one finishes first and, removing temporary files,
    removes the manifest we are writing: ours is then a complete job too, not a FileNotFoundError."""
    from nanoset.tokenize import job as tokenize_mod
    from nanoset.tokenize.job import TokenizeOptions

    out = tmp_path / "out"
    base = ["tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet"]
    run_cli(*base, "--num-tasks", 2, "--task-index", 0)
    def the_other_finishes_first(folder, manifest):
        assert "; complete" in run_cli(*base, "--num-tasks", 2, "--task-index", 0).stdout
        raise FileNotFoundError(2, "No such file or directory", str(folder / ".nanoset.json.tmp-1"))

    monkeypatch.setattr(tokenize_mod, "write_manifest", the_other_finishes_first)
    summary = tokenize_mod.tokenize(TokenizeOptions(inputs=[str(CORPUS)], output=out, tokenizer=str(TOKENIZER),
                                                    task_bytes=200_000, num_tasks=2, task_index=1, progress=False))
    assert summary.complete
    assert same_folder(fixture_dataset, out)


def test_partials_of_the_tasks_to_run_are_removed_in_one_listing(tmp_path, monkeypatch):
    """Before running, the temporary files of the tasks about to run go: one glob of the folder for all of
    them (one per task read the whole folder 2,000 times: 20 s), and never another task's files."""
    from pathlib import Path as PathType

    from nanoset.tokenize.tasks import OutputFolder

    names = [".00001_00000.ds.partial-7", ".00001_00001.ds.index.partial-7", ".00010_00000.ds.loss.partial-9",
             ".00002_00000.ds.partial-8", "00001_00000.ds", ".00100_00000.ds.partial-7"]
    for name in names:
        (tmp_path / name).write_text("x")
    globs = []
    real = PathType.glob
    monkeypatch.setattr(PathType, "glob", lambda self, pattern: globs.append(pattern) or real(self, pattern))
    OutputFolder(tmp_path).remove_partials(["00001", "00010", "00003"])
    assert len(globs) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".00002_00000.ds.partial-8", ".00100_00000.ds.partial-7",
                                                          "00001_00000.ds"]


def test_a_process_killed_by_a_signal_without_a_name_is_said_in_words():
    """A real-time signal has no ``signal.Signals`` name: the line says its number (it was a traceback)."""
    from nanoset.errors import killed_by
    from nanoset.tokenize.taskpool import WorkerDied

    assert killed_by(signal.SIGKILL) == "killed by SIGKILL (often the out-of-memory killer)"
    assert killed_by(signal.SIGTERM) == "killed by SIGTERM"
    assert killed_by(signal.SIGRTMIN + 1) == f"killed by signal {signal.SIGRTMIN + 1}"
    assert WorkerDied("task", -(signal.SIGRTMIN + 1)).cause() == f"was killed by signal {signal.SIGRTMIN + 1}"
    assert WorkerDied("task", 3).cause() == "exited with status 3"
