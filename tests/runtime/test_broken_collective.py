"""A worker whose collective another worker's end broke: how it is recognised, what it leaves in the run folder and
for torchrun's agent, and how the launcher picks the failure to report (the runs: tests/cluster/test_launch_cluster.py,
a worker killed mid-run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from runtime.broken_collective import broken_collective, leave_quietly, traceback_path, tracebacks_since
from runtime.cli.agent import BROKEN_COLLECTIVE, USER_ERROR, failure_message, root_failure
from runtime.cli.launch import ended_with_it
from tests.support import ROOT
from tests.support.harness import free_port

# two gloo ranks; rank 1 exits before the all-reduce, rank 0 says whether its error is recognised
PEER_DIES = '''
import os, sys
import torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=2)
dist.barrier()
if rank == 1:
    os._exit(0)
try:
    dist.all_reduce(torch.ones(1))
except Exception as e:
    from runtime.broken_collective import broken_collective
    print(type(e).__name__, broken_collective(e))
'''


def test_the_error_of_a_gloo_collective_whose_peer_died_is_recognised():
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", PEER_DIES, str(rank), port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    (out, err), _ = [rank.communicate(timeout=120) for rank in ranks]
    assert out == "RuntimeError True\n", err


def gloo_error() -> RuntimeError:
    return RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[127.0.0.1]:23456")


def test_what_counts_as_a_broken_collective():
    assert broken_collective(gloo_error())
    assert broken_collective(dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp: remote process exited"))
    try:  # one raised while handling it (or from it) is its consequence too
        try:
            raise gloo_error()
        except RuntimeError as e:
            raise KeyError("cleanup") from e
    except KeyError as chained:
        assert broken_collective(chained)
    assert not broken_collective(RuntimeError("shape mismatch in the model"))
    assert not broken_collective(ValueError("Connection closed by peer"))


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:
        return e


@pytest.fixture
def under_an_agent(tmp_path, monkeypatch) -> Path:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("WORLD_SIZE", "2")
    return error_file


def test_a_broken_collective_under_an_agent_leaves_its_traceback_in_the_run_folder(tmp_path, under_an_agent):
    run = tmp_path / "run"
    error = raised(gloo_error())
    assert leave_quietly(error, run, rank=1, step=4)
    path = run / "tracebacks" / "rank-1.txt"
    assert path == traceback_path(run, 1)
    lines = path.read_text().splitlines()
    assert lines[:3] == [f"rank 1 (pid {os.getpid()}) after step 4: a collective operation failed, most likely because "
                         f"another rank ended first (the launcher's line, or torchrun's report, names it)", "",
                         "Traceback (most recent call last):"]
    assert lines[-1] == f"RuntimeError: {error}"
    data = json.loads(under_an_agent.read_text())
    assert data["errorTraits"]["category"] == BROKEN_COLLECTIVE
    assert failure_message(data) == (f"rank 1: a collective operation failed after step 4, most likely because another "
                                     f"rank ended (RuntimeError: {error}); its traceback: {path}")


def test_anything_else_keeps_its_traceback_on_the_console(tmp_path, under_an_agent, monkeypatch):
    run = tmp_path / "run"
    assert not leave_quietly(raised(RuntimeError("a bug")), run, rank=1, step=4)  # a bug
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert not leave_quietly(raised(gloo_error()), blocked, rank=1, step=4)  # no run folder to keep it in
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not leave_quietly(raised(gloo_error()), run, rank=0, step=4)  # no peer
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    assert not leave_quietly(raised(gloo_error()), run, rank=1, step=4)  # no agent reports the cause
    assert not run.exists() and not under_an_agent.exists()


def failure(exitcode: int, timestamp: int, category: str | None = None) -> SimpleNamespace:
    data = {"errorTraits": {"category": category}} if category else {}
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, error_file_data=data)


def test_the_launcher_reports_the_cause_not_its_consequences():
    killed = failure(-9, 100)
    # the survivor exited before the agent saw the death, in the same second, and is listed first
    assert root_failure({0: failure(1, 100, BROKEN_COLLECTIVE), 1: killed}) == (1, killed)
    # a rank waiting to be ended after a user error that rank 0 says, torn down with SIGTERM, marked a second earlier
    said = failure(1, 101, USER_ERROR)
    assert root_failure({1: failure(-15, 100), 0: said}) == (0, said)
    first = failure(1, 100, BROKEN_COLLECTIVE)  # nothing but broken collectives (a peer hung): the first of them
    assert root_failure({0: failure(1, 101, BROKEN_COLLECTIVE), 1: first}) == (1, first)


def test_the_launchers_line_names_the_tracebacks_of_this_launch(tmp_path):
    run = tmp_path / "run"
    for rank in (0, 2, 3):
        traceback_path(run, rank).parent.mkdir(parents=True, exist_ok=True)
        traceback_path(run, rank).write_text("")
    os.utime(traceback_path(run, 3), (1000, 1000))  # an earlier launch's
    found = tracebacks_since(run, since=2000)
    assert found == {0: traceback_path(run, 0), 2: traceback_path(run, 2)}
    assert ended_with_it(found) == (f"; ranks 0, 2 ended with it (their broken collectives' tracebacks: "
                                    f"{run / 'tracebacks'})")
    assert ended_with_it({2: found[2]}) == f"; rank 2 ended with it (its broken collective's traceback: {found[2]})"
    assert ended_with_it({}) == "" and tracebacks_since(tmp_path / "none", since=0) == {}
