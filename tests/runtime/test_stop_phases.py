"""What a stop signal means once the training loop is over, by how it ended (the runs themselves:
tests/cluster/test_launch_cluster.py)."""

from __future__ import annotations

import signal

import pytest

from runtime.control.preemption import StopOnSignal

FINISHES = ("note: SIGTERM after the last step: the run finishes what follows it (the final checkpoint, the Hugging "
            "Face export) and ends\n")


def test_a_signal_after_the_last_step_says_the_run_finishes(capsys):
    stop = StopOnSignal()
    with stop.training():
        pass
    stop._on_signal(signal.SIGTERM, None)
    assert (stop.phase, stop.signum, capsys.readouterr().out) == ("done", signal.SIGTERM, FINISHES)


def test_a_signal_after_the_loop_raised_says_nothing(capsys):
    """A loop that ended by an exception (a collective broken by a dead rank, a bug) was marked 'after the last step'
    by a ``finally``: the SIGTERM with which torchrun tears a failed run down said the run would finish its final
    checkpoint and export, at step 6 of 30. Nothing follows an error but the process's end."""
    stop = StopOnSignal()
    with pytest.raises(RuntimeError), stop.training():
        raise RuntimeError("Connection closed by peer")
    stop._on_signal(signal.SIGTERM, None)
    assert (stop.phase, stop.signum, capsys.readouterr()) == ("failed", signal.SIGTERM, ("", ""))


def test_a_signal_after_an_agreed_stop_says_nothing_on_a_rank_that_got_none(capsys):
    """SIGUSR1 to rank 1 only: both ranks stop after the same step; torchrun then tears rank 0 down with SIGTERM
    while it prints its last line: that is no signal after the last step."""
    stop = StopOnSignal()
    with stop.training():
        stop.agreed_code = signal.SIGUSR1  # what the ranks agreed on: another rank's signal
    stop._on_signal(signal.SIGTERM, None)
    assert (stop.phase, capsys.readouterr()) == ("stopped", ("", ""))
    assert (stop.exit_status, stop.reason) == (128 + signal.SIGUSR1, "SIGUSR1 (sent to another rank)")
