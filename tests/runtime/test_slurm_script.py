"""tools/slurm/train.sbatch: valid bash, its warning signal one that the runtime stops on, and, run with stand-ins
for srun, scontrol and nanoset, a `nanoset train` command line the launcher accepts and a requeue after a stop."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys

from runtime.control.preemption import STOP_SIGNALS, stop_status
from tests.support import ROOT

SCRIPT = ROOT / "tools" / "slurm" / "train.sbatch"

# `nanoset train` as the launcher parses it: the parsed arguments to a file, then the status of a stop by SIGUSR1
NANOSET = f"""#!{sys.executable}
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
from runtime.cli.launch import parse_args
assert sys.argv[1] == "train"
args = parse_args(sys.argv[2:])
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[2:], "nodes": args.nodes, "nproc": args.nproc, "config": args.config,
                        "overrides": args.overrides}}) + "\\n")
sys.exit(138)
"""
SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then printf 'gpu-node-1\\ngpu-node-2\\n'; else echo "scontrol $*" >> "$RECORD"; fi
"""


def test_the_script_is_valid_bash_and_its_signal_stops_a_run():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    (name,) = re.findall(r"^#SBATCH --signal=(?:B:)?([A-Z0-9]+)@\d+$", text, re.M)
    sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    assert sig in STOP_SIGNALS
    (status,) = re.findall(r"^STOP_STATUS=(\d+)", text, re.M)
    assert int(status) == stop_status(sig)  # what a run stopped by it exits with: the status that requeues
    assert "#SBATCH --requeue" in text.splitlines()


def test_the_script_starts_a_launcher_per_node_and_requeues_after_a_stop(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nanoset", NANOSET), ("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu-node-[1-2]", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
           "SLURM_GPUS_ON_NODE": "8", "NANOSET_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(SCRIPT), "cfg.yaml", "--set", "tokens.train_steps=100"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 138, proc.stderr
    launched, requeued = record.read_text().splitlines()
    got = json.loads(launched)
    assert (got["config"], got["nodes"], got["nproc"], got["overrides"]) == ("cfg.yaml", 2, 8,
                                                                             ["tokens.train_steps=100"])
    assert "--rdzv-endpoint gpu-node-1:29500 --rdzv-id 4242" in " ".join(got["argv"])
    assert requeued == "scontrol requeue 4242"
    assert "requeueing job 4242 to resume" in proc.stdout
