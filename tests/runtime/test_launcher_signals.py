"""The launcher's answer to a stop signal, by what its workers are doing (the runs themselves:
tests/cluster/test_launch_cluster.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from runtime.cli.agent import LauncherSignals
from runtime.preemption import StopRequested


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
