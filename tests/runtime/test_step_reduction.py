"""The step's one reduction: named parts summed over the world in one all-reduce and read back once; the stop
signal agreed through it as a MAX would."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from runtime.control.preemption import LAUNCHER_LOST, StopOnSignal
from runtime.parallel.step_reduction import StepReduction
from tests.support.harness import run_distributed


def test_parts_keep_the_order_added_whether_on_the_host_or_the_device():
    r = StepReduction(torch.device("cpu"))
    r.add("a", 2.0)
    r.add("b", torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    r.add("c", [5, 6])
    r.add("d", torch.tensor(7.0), counted=False)
    assert r.reduce().tolist() == [2.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0]
    assert r.on_device("b").tolist() == [1.0, 2.0, 3.0, 4.0]
    r.read(torch.tensor(9.5), torch.tensor(float("inf")))
    assert r.values("c") == [5.0, 6.0] and r.value("a") == 2.0 and r.value("d") == 0.0
    assert r.values("extra") == [9.5, float("inf")]


def test_a_name_added_twice_or_after_the_reduction_is_a_bug():
    r = StepReduction(torch.device("cpu"))
    r.add("a", 1.0)
    with pytest.raises(ValueError, match="'a' added twice"):
        r.add("a", 2.0)
    r.reduce()
    with pytest.raises(RuntimeError, match="'b' added after the reduction"):
        r.add("b", 1.0)


def summed_over_ranks(rank: int, world: int, out_path: str) -> None:
    """Rank 0 gives host numbers where rank 1 gives device tensors (the same layout); rank 0 got SIGTERM and
    rank 1 SIGUSR1: the agreed code is SIGTERM's (the higher), as the MAX all-reduce it replaces said."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r = StepReduction(torch.device("cpu"))
    r.add("loss", 1.5 if rank == 0 else torch.tensor(2.5, dtype=torch.float64))
    r.add("tokens", 10 if rank == 0 else 0, counted=rank == 0)
    stop = StopOnSignal()
    stop.signum = signal.SIGTERM if rank == 0 else signal.SIGUSR1
    stop.add_to(r)
    r.read()
    agreed = stop.agree_from(r)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump({"loss": r.value("loss"), "tokens": r.value("tokens"), "agreed": agreed,
                   "code": stop.agreed_code}, f)


def test_parts_are_summed_over_the_world_and_the_stop_is_the_highest_code(tmp_path):
    out = tmp_path / "out"
    run_distributed(2, summed_over_ranks, str(out))
    for rank in range(2):
        got = json.loads((tmp_path / f"out.{rank}").read_text())
        assert got == {"loss": 4.0, "tokens": 10.0, "agreed": True, "code": int(signal.SIGTERM)}


def test_no_stop_anywhere_agrees_on_none_and_a_lost_launcher_is_its_own_code():
    r = StepReduction(torch.device("cpu"))
    stop = StopOnSignal()
    stop.add_to(r)
    r.read()
    assert stop.agree_from(r) is False and stop.agreed_code == 0
    r = StepReduction(torch.device("cpu"))
    lost = StopOnSignal()
    lost.launcher_lost = True
    lost.add_to(r)
    r.read()
    assert lost.agree_from(r) is True and lost.agreed_code == LAUNCHER_LOST
