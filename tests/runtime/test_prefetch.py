"""The in-process prefetch thread (data.prefetch): order, failures, release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import pytest

from runtime.data import DataPlan
from runtime.data.loading.prefetch import PrefetchIterator, PrefetchLoader
from tests.support import ROOT
from tests.support.configs import make_config, small_config
from tests.support.data import stage_loader


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nanoset-prefetch" and t.is_alive()]


def test_prefetch_keeps_the_order_and_ends():
    it = iter(PrefetchLoader(range(7), 2))
    assert list(it) == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(StopIteration):
        next(it)
    assert len(PrefetchLoader(range(7), 2)) == 7 and not it.alive


def test_prefetched_loader_gives_the_same_batches(shards, monkeypatch):
    monkeypatch.chdir(shards)
    plan = DataPlan(make_config(mbs=2, accum=1))
    stage = plan.stages[0]
    plain = iter(stage_loader(plan, stage, 0, 1))
    from types import SimpleNamespace

    from runtime.data import StageDataset, get_train_dataloader

    ctx = SimpleNamespace(dp_rank=0, dp_size=1, pp_rank=0)
    fetched = iter(get_train_dataloader(StageDataset(plan, stage), stage.sequence_length, ctx, 0, 0, 2,
                                        use_position_ids=stage.use_position_ids, prefetch=3))
    assert isinstance(fetched, PrefetchIterator)
    with_workers = get_train_dataloader(StageDataset(plan, stage), stage.sequence_length, ctx, 0, 0, 2,
                                        dataloader_num_workers=1, prefetch=3)
    assert type(with_workers).__name__ == "DataLoader"  # workers read ahead themselves
    for _ in range(12):
        a, b = next(plain), next(fetched)
        assert sorted(a) == sorted(b)
        for key in a:
            assert np.array_equal(a[key].numpy(), b[key].numpy()), key
    fetched.close()
    assert not fetched.alive


def _failing_source():
    yield "a"
    yield "b"
    raise ValueError("window 5 of /data/web is unreadable")


def test_an_error_in_the_thread_reaches_the_consumer_with_its_traceback():
    it = iter(PrefetchLoader(_failing_source(), 4))
    assert [next(it), next(it)] == ["a", "b"]
    with pytest.raises(RuntimeError, match="the data prefetch thread failed: ValueError: window 5 of /data/web") as e:
        next(it)
    cause = e.value.__cause__
    assert isinstance(cause, ValueError)
    frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
    assert frames[-1] == "_failing_source"  # where it was raised, in the thread
    assert not it.alive
    with pytest.raises(StopIteration):
        next(it)


def test_close_stops_a_thread_that_waits_for_room_and_one_that_reads():
    before = len(_prefetch_threads())
    full = PrefetchIterator(iter(range(10**9)), 2)  # the queue fills at once; the thread waits in put()
    time.sleep(0.2)
    full.close()
    assert not full.alive

    def slow():
        while True:
            time.sleep(0.3)
            yield 1

    reading = PrefetchIterator(slow(), 2)
    assert next(reading) == 1
    reading.close()  # joined after its current read
    assert not reading.alive and len(_prefetch_threads()) == before
    dropped = PrefetchIterator(iter(range(10**9)), 2)  # a consumer that is dropped without close()
    thread = dropped._thread
    del dropped
    thread.join(timeout=5)
    assert not thread.is_alive()


TRAIN = r'''
import json, sys, threading
sys.path.insert(0, {root!r})
from runtime.data.loading.dataset import StageDataset
from runtime.data.loading.feed import StepFeed
from runtime.trainer import Trainer

def alive():
    return sum(t.name == "nanoset-prefetch" and t.is_alive() for t in threading.enumerate())

seen = []
switch = StepFeed._switch
def spy(self, stage, step):
    old = self._iterator
    switch(self, stage, step)  # the previous stage's thread is joined before the new one starts
    seen.append((step, old is not None and old._thread.is_alive(), type(self._iterator).__name__))
StepFeed._switch = spy
if "--fail" in sys.argv:
    calls = []
    original = StageDataset.__getitems__
    def flaky(self, indices):
        calls.append(1)
        if len(calls) == 4:
            raise ValueError("window 5 of shards/web is unreadable")
        return original(self, indices)
    StageDataset.__getitems__ = flaky
trainer = Trainer(sys.argv[1])
out = {{}}
try:
    trainer.train()
except RuntimeError as e:
    import traceback
    out["error"] = str(e)
    out["cause"] = repr(e.__cause__)
    out["frames"] = [f.name for f in traceback.extract_tb(e.__cause__.__traceback__)][-1:]
out["switches"] = seen
out["alive_after"] = alive()
trainer.close()
print(json.dumps(out))
'''


@pytest.mark.parametrize("fail", [False, True])
def test_trainer_joins_the_thread_at_stage_switch_at_exit_and_on_failure(shards, tmp_path, fail):
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=6, boundary=4, interval=0)
    import yaml

    d = yaml.safe_load(cfg.read_text())
    for stage in d["data_stages"]:
        stage["data"].update(num_loading_workers=0, prefetch=2)
    d["checkpoints"]["save_final"] = False
    cfg.write_text(yaml.safe_dump(d))
    script = tmp_path / "train_prefetch.py"
    script.write_text(TRAIN.format(root=str(ROOT)))
    proc = subprocess.run([sys.executable, str(script), str(cfg)] + (["--fail"] if fail else []), cwd=shards,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["alive_after"] == 0
    if fail:  # the 4th micro-batch read fails: step 4 never runs
        assert out["error"] == ("the data prefetch thread failed: ValueError: window 5 of shards/web is unreadable")
        assert out["cause"] == "ValueError('window 5 of shards/web is unreadable')"
        assert out["frames"] == ["flaky"]
    # the first stage reads 3 micro-batches; the 4th read is the second stage's first
    assert out["switches"] == [[1, False, "PrefetchIterator"], [4, False, "PrefetchIterator"]]


def test_a_negative_prefetch_is_one_clear_error():
    import copy

    from runtime.config import Config, ConfigError
    from runtime.config.load import from_dict
    from runtime.config.rules import validate_config
    from tests.support.configs import TWO_STAGE as BASE

    d = copy.deepcopy(BASE)
    d["data_stages"][0]["data"]["prefetch"] = -1
    with pytest.raises(ConfigError) as e:
        validate_config(from_dict(Config, d, "config"))
    assert str(e.value) == "data_stages[0] (pretrain).data.prefetch: must be ≥ 0, got -1"
