"""A checkpoint that cannot be written (a full disk) is one line naming the folder and the cause, its partial
folder is removed, the earlier checkpoints stay, and the rerun resumes from them."""

from __future__ import annotations

import subprocess
import sys

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
def save_on_a_full_disk(self, engine, step, metadata):
    if step == 4:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
    return save(self, engine, step, metadata)
store.CheckpointManager.save = save_on_a_full_disk
from runtime.train import main
sys.exit(main())
"""


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_rerun_resumes(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards)
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
