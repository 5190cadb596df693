"""nanoset train's command line: its options and torchrun's, each mistake one line (was: a traceback for
--nnodes 0 or abc, a stray positional run as the workers' script, torchrun's usage dump, an elastic --nnodes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime.cli.launch import LaunchArgs, UsageError, parse_args

HELP = " (see nanoset train --help)"


@pytest.mark.parametrize("given, said", [
    (["--nnodes", "0"], "--nnodes '0': give a positive number of nodes"),
    (["--nnodes", "abc"], "--nnodes 'abc': give a positive number of nodes"),
    (["--nnodes=2:1"], "--nnodes 2:1: the config's parallelism fixes the number of processes, so the number of nodes "
                       "too; give one number (--nnodes 1)"),
    (["--nnodes=1:2"], "--nnodes 1:2: the config's parallelism fixes the number of processes, so the number of nodes "
                       "too; give one number (--nnodes 2)"),
    (["extra.py"], "takes no positional argument ('extra.py'): it runs runtime/train.py with --config"),
    (["--nproc_per_node=1", "runtime/train.py"],  # the torchrun habit
     "takes no script: it runs runtime/train.py itself; drop 'runtime/train.py' from the command"),
    (["-m", "runtime.train"], "-m/--module is not for nanoset train, whose workers run runtime/train.py"),
    (["--no-python"], "--no-python is not for nanoset train, whose workers run runtime/train.py"),
    (["--nproc-per-node", "0"], "argument --nproc-per-node/--nproc_per_node: '0' is not a positive number of "
                                "processes"),
    (["--nproc-per-node", "two"], "argument --nproc-per-node/--nproc_per_node: 'two' is not a positive number of "
                                  "processes"),
    (["--max-restarts", "x"], "argument --max-restarts/--max_restarts: invalid int value: 'x'"),  # torchrun's, one line
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--chek"], "unrecognized arguments: --chek; did you mean --check?"),  # a typo: the closest option
    (["--nprocs-per-node", "2"], "unrecognized arguments: --nprocs-per-node; did you mean --nproc-per-node?"),
    (["--rdzv-endpont=h:1"], "unrecognized arguments: --rdzv-endpont=h:1; did you mean --rdzv-endpoint?"),  # torchrun's
])
def test_a_command_line_mistake_is_one_usage_error(given, said):
    with pytest.raises(UsageError) as e:
        parse_args(["--config", "c.yaml", *given])
    assert str(e.value) == f"nanoset train: {said}{HELP}"


def test_torchrun_options_pass_through_and_give_the_number_of_nodes():
    argv = ["--config", "c.yaml", "--nproc-per-node", "4", "--nnodes=2:2", "--node-rank", "1", "--max-restarts", "3"]
    assert parse_args(argv) == LaunchArgs("c.yaml", 4, False, ["--nnodes=2:2", "--node-rank", "1", "--max-restarts",
                                                               "3"], 2)
    assert parse_args(["--check", "--config", "c.yaml"]) == LaunchArgs("c.yaml", None, True, [], 1)


def test_nanoset_train_says_a_usage_error_in_one_line_with_status_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", "train", "--config", "c.yaml", "--nnodes", "0"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: nanoset train: --nnodes '0': give a positive number of nodes{HELP}\n")
