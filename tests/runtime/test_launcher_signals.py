"""The launcher's answer to a stop signal, by what its workers are doing (the runs themselves:
tests/cluster/test_launch_cluster.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from runtime.cli.agent import LauncherSignals, handles_stop_signals
from runtime.control.preemption import StopRequested


def test_before_any_worker_a_stop_signal_ends_the_launcher():
    with pytest.raises(StopRequested) as e:
        LauncherSignals()._on_signal(signal.SIGTERM, None)
    assert (e.value.signum, e.value.name) == (signal.SIGTERM, "SIGTERM")


def test_a_ctrl_c_after_the_workers_stopped_neither_kills_nor_says_start_up():
    """Workers that exited after their checkpoint (zombies until the agent reads their status): a second Ctrl-C then
    is no 'interrupted twice' (their checkpoint was saved) and no 'stopped during start-up'."""
    worker = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline and open(f"/proc/{worker.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.02)
    signals = LauncherSignals()
    signals.watch(lambda: [worker.pid])
    signals.first = signal.SIGINT  # the first Ctrl-C, forwarded
    signals._on_signal(signal.SIGINT, None)
    assert signals.killed is False
    worker.wait()


def test_a_stop_signal_once_the_workers_ended_is_no_start_up_stop():
    """Workers that finished (or crashed before a restart): a SIGTERM then said 'stopped during start-up, nothing
    to save', status 143, of a run that was done; now it is kept for a restart, and the run's status stands."""
    signals = LauncherSignals()
    signals.watch(list)  # no live worker
    signals.started = True
    signals._on_signal(signal.SIGTERM, None)
    assert signals.first == signal.SIGTERM and not signals.killed


def test_a_second_ctrl_c_kills_a_running_worker_and_its_session():
    ignores_ctrl_c = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", ignores_ctrl_c], start_new_session=True)
    signals = LauncherSignals()
    signals.watch(lambda: [worker.pid])
    time.sleep(0.5)
    signals._on_signal(signal.SIGINT, None)  # forwarded: the worker ignores it here
    assert signals.first == signal.SIGINT and worker.poll() is None
    signals._on_signal(signal.SIGINT, None)
    assert signals.killed and worker.wait(10) == -signal.SIGKILL


def test_a_signal_for_a_worker_still_starting_waits_for_its_handlers():
    """A Ctrl-C forwarded in a worker's first moments (imports, before its handlers) was a KeyboardInterrupt
    traceback (or 'killed by SIGTERM'): it is sent once the worker answers the stop signals."""
    starting = ("import signal, sys, time\ntime.sleep(0.5)\n"
                "stop = lambda n, f: (print('stopped by', signal.Signals(n).name, flush=True), sys.exit(130))\n"
                "for s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, stop)\ntime.sleep(30)")
    worker = subprocess.Popen([sys.executable, "-c", starting], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    time.sleep(0.1)
    assert handles_stop_signals(worker.pid) is False
    LauncherSignals.forward(signal.SIGINT, [worker.pid])
    out, err = worker.communicate(timeout=30)
    assert (worker.returncode, out, err) == (130, "stopped by SIGINT\n", "")
