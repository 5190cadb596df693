"""A checkpoint that cannot be written (a full disk) is one line naming the folder and the cause, its partial
folder is removed, the earlier checkpoints stay, and the rerun resumes from them; metrics.jsonl that cannot be
written is one line naming it."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys

import pytest

from nanoset.atomic import atomic_write, atomic_write_text
from nanoset.errors import WriteFailed
from runtime.checkpoint.layout import resolve_resume
from runtime.observe.metrics import MetricsLogger
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, train_one

# runtime.train with file writes limited to 64 KiB from the checkpoint of step 4 on: the model shards no longer
# fit, as on a full disk (the write fails with EFBIG instead of ENOSPC; SIGXFSZ ignored, as the kernel requires)
FULL_DISK = f"""
import resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from runtime.checkpoint import store
save = store.CheckpointManager.save
def save_on_a_full_disk(self, engine, step, metadata, **kwargs):
    if step == 4:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
    return save(self, engine, step, metadata, **kwargs)
store.CheckpointManager.save = save_on_a_full_disk
from runtime.train import main
sys.exit(main())
"""


def run_with_fault(shards, tmp_path, script_text: str):
    """runtime.train, one process, 6 steps with a checkpoint every 2, run through a script that plants a fault."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True)
    script = tmp_path / "fault.py"
    script.write_text(script_text)
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards)
    return run, cfg, proc


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_rerun_resumes(shards, tmp_path):
    run, cfg, proc = run_with_fault(shards, tmp_path, FULL_DISK)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line.startswith(f"error: {run}/checkpoints: saving the checkpoint of step 4 failed (")
    assert ("File too large" in line or "a write was cut short: no space left on the device, or a file size limit"
            in line) and line.endswith(
        "; its partial folder was removed and the checkpoints before it are intact (latest: step-000002); free "
        "space and rerun to resume")
    folder = run / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-000002"]  # no .tmp-step-000004 left
    resumed = train_one(cfg, cwd=shards)
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


# runtime.train whose disk fills up just as the checkpoint of step 4 writes `latest` (the checkpoint's own files
# fit): the temporary `latest` is a link to /dev/full, so its flush fails with the kernel's own ENOSPC
FULL_AT_LATEST = f"""
import os, sys, uuid
sys.path.insert(0, {str(ROOT)!r})
from runtime.checkpoint import layout, store
write_beside = layout.write_beside
def latest_on_a_full_disk(path, write):
    if path.name != "latest" or not FULL[0]:
        return write_beside(path, write)
    tag = uuid.uuid4()
    os.symlink("/dev/full", path.with_name(f".latest.tmp-{{os.getpid()}}-{{tag.hex[:12]}}"))
    uuid4, uuid.uuid4 = uuid.uuid4, lambda: tag
    try:
        return write_beside(path, write)
    finally:
        uuid.uuid4 = uuid4
layout.write_beside = latest_on_a_full_disk
FULL = [False]
save = store.CheckpointManager.save
def save_on_a_full_disk(self, engine, step, metadata, **kwargs):
    FULL[0] = step == 4
    return save(self, engine, step, metadata, **kwargs)
store.CheckpointManager.save = save_on_a_full_disk
from runtime.train import main
sys.exit(main())
"""


def test_a_full_disk_while_writing_latest_is_one_line_and_leaves_nothing_behind(shards, tmp_path):
    """`latest` was written after the checkpoint's rename, outside the failure handling: a bare
    `[Errno 28] No space left on device`, a `.latest.tmp-PID` left for good, and a rerun refused ("checkpoints
    step-000003 but no latest pointer"). It is written with the checkpoint's files now."""
    run, cfg, proc = run_with_fault(shards, tmp_path, FULL_AT_LATEST)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line.startswith(f"error: {run}/checkpoints: saving the checkpoint of step 4 failed (latest: No space left "
                           f"on device; ")
    assert line.endswith("; its partial folder was removed and the checkpoints before it are intact (latest: "
                         "step-000002); free space and rerun to resume")
    folder = run / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-000002"]  # no .latest.tmp-*, no .tmp-step-*
    resumed = train_one(cfg, cwd=shards)
    assert f"resumed from {folder / 'step-000002'} at step 2" in resumed.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_a_complete_checkpoint_without_latest_is_the_one_resumed(tmp_path):
    """A kill between a checkpoint's rename and its `latest`: the rerun refused ("checkpoints step-000003 but no
    latest pointer; set checkpoints.resume to one of them"); the newest complete checkpoint is the latest."""
    folder = tmp_path / "checkpoints"
    for step in (3, 6, 10):
        (folder / f"step-{step:06d}").mkdir(parents=True)
        (folder / f"step-{step:06d}" / "metadata.json").write_text("{}")
    (folder / "step-000012").mkdir()  # incomplete: no metadata.json
    assert resolve_resume(folder, "latest") == folder / "step-000010"
    assert resolve_resume(tmp_path / "none", "latest") is None


def test_an_atomic_write_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteFailed) as e:
        atomic_write(tmp_path / "latest", full)
    assert str(e.value) == (f"{tmp_path / 'latest'}: cannot write it (No space left on device); free some space (or "
                            f"fix the cause) and rerun the same command")
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "latest", "step-000003\n")
    assert list(tmp_path.iterdir()) == []


def _file_size_limit(size: int):
    def limit() -> None:  # a write past `size` bytes fails with EFBIG (SIGXFSZ ignored, as a shell's ulimit -f)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_metrics_that_cannot_be_written_are_one_line_naming_the_file(shards, tmp_path):
    """metrics.jsonl growing past a file size limit (checkpoints only at the end): a bare `[Errno 27] File too
    large` without the file's name. Under the launcher, with two ranks, the same one line."""
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=2, steps=12, interval=0, single_stage=True)
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", "--config", str(cfg), "--nproc-per-node",
                           "2"], capture_output=True, text=True, cwd=shards, preexec_fn=_file_size_limit(1500),
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert error_lines(proc.stderr) == [f"error: {run / 'metrics.jsonl'}: cannot write it (File too large); free "
                                        f"some space (or fix the cause) and rerun the same command"]
    assert "step      1/12 |" in proc.stdout and "step     12/12 |" not in proc.stdout  # stopped where it could not log


def test_metrics_on_a_full_disk_are_one_line_naming_the_file(tmp_path):
    """The kernel's own ENOSPC: metrics.jsonl is a link to /dev/full."""
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    logger.path.symlink_to("/dev/full")
    message = (f"{logger.path}: cannot write it (No space left on device); free some space (or fix the cause) and "
               f"rerun the same command")
    with pytest.raises(WriteFailed) as e:
        logger.log_validation(4, "sft", {"web": {"loss": 2.5, "ppl": 12.2, "tokens": 2}}, ["web: loss 2.5"])
    assert str(e.value) == message
    row = {"step": 4, "stage": "sft", "loss": 2.5, "lr": 1e-3, "grad_norm": 1.0, "skipped": False,
           "tokens_per_s": 1.0, "data_wait_ms": 0.0, "mfu": None}
    with pytest.raises(WriteFailed) as e:
        logger.log(row)
    assert str(e.value) == message


def test_metrics_that_cannot_be_rewritten_at_resume_are_one_line_on_every_rank(shards, tmp_path):
    """A resume rewrites metrics.jsonl (rank 0 alone) before the first step: a full disk there was rank 0's line
    followed by rank 1's gloo 'Connection closed by peer' traceback."""
    run = tmp_path / "run"
    train = [sys.executable, "-m", "nanoset.cli", "train", "--nproc-per-node", "2", "--config"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cfg = small_config(tmp_path, run, dp=2, steps=6, interval=3, single_stage=True)
    first = subprocess.run([*train, str(cfg)], capture_output=True, text=True, cwd=shards, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    size = (run / "metrics.jsonl").stat().st_size
    cfg = small_config(tmp_path, run, dp=2, steps=9, interval=3, single_stage=True)
    proc = subprocess.run([*train, str(cfg)], capture_output=True, text=True, cwd=shards, env=env, timeout=300,
                          preexec_fn=_file_size_limit(size - 1))  # the rewrite cannot hold the file
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert error_lines(proc.stderr) == [f"error: {run / 'metrics.jsonl'}: cannot write it (File too large); free "
                                        f"some space (or fix the cause) and rerun the same command"]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]  # the old file, untouched


# runtime.train killed (SIGKILL) at the save of step 4 after the checkpoint's rename, before latest's
KILLED_BETWEEN_RENAMES = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from runtime.checkpoint import store
commit = store.commit_latest
def killed(folder, staged):
    if staged.read_text().strip() == "step-000004":
        os.kill(os.getpid(), signal.SIGKILL)
    commit(folder, staged)
store.commit_latest = killed
from runtime.train import main
sys.exit(main())
"""


def test_a_run_killed_between_the_two_renames_resumes_the_new_checkpoint(shards, tmp_path):
    """latest still named step 2 and the staged pointer was deleted: the plain rerun took the complete step 4 for
    a later branch, moved it to rewound-*/ and trained steps 3-4 again."""
    run, cfg, proc = run_with_fault(shards, tmp_path, KILLED_BETWEEN_RENAMES)
    assert proc.returncode == -9
    folder = run / "checkpoints"
    assert (folder / "latest").read_text() == "step-000002\n" and (folder / "step-000004" / "metadata.json").is_file()
    assert resolve_resume(folder, "latest") == folder / "step-000004"
    resumed = train_one(cfg, cwd=shards)
    assert f"resumed from {folder / 'step-000004'} at step 4" in resumed.stdout and "rewound" not in resumed.stdout
    assert not list(run.glob("rewound-*"))
    assert (folder / "latest").read_text() == "step-000006\n" and not list(folder.glob(".latest.tmp-*"))
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
