"""Weights & Biases: every metrics.jsonl row reaches W&B under TensorBoard's names, one W&B run across a resume at
its last step, a fork at a resume that goes back (never a repeated step), and W&B's absence or failure is one
note while training goes on. The logic runs through a fake ``wandb`` module (tests/support/fake_wandb); the real
package's offline files are read back once with its own protobuf classes."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.config.schema import WandbArgs
from runtime.observe.metrics import MetricsLogger, parameter_count, scalars
from runtime.observe.wandb_logger import RECORD, WandbLogger, WandbStart, choose_run, read_record, start_wandb
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics

FAKE = ROOT / "tests" / "support" / "fake_wandb"
NAMES = {"shards/web": "web", "shards/code": "code", "shards/sft": "sft"}  # short_names of the run's folders


def fake_wandb(monkeypatch, log: Path):
    """The fake module, imported in this process as ``wandb``."""
    spec = importlib.util.spec_from_file_location("wandb", FAKE / "wandb" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("FAKE_WANDB_LOG", str(log))
    return module


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


# ------------------------------------------------------------------ which run ------------------

def test_choose_run_continues_at_or_past_the_last_logged_step_and_forks_before_it():
    """The resume step against the last step logged (12) and the last step of a finished W&B run (synced)."""
    args = WandbArgs(project="p", entity="team")
    record = {"run_id": "aaaa1111", "project": "p", "entity": "team", "synced_step": 12}
    ids = iter(["new00001", "new00002", "new00003", "new00004"])
    assert choose_run(None, args, 0, 0, lambda: next(ids)) == WandbStart("new00001")
    at, past = choose_run(record, args, 12, 12, lambda: "unused"), choose_run(record, args, 12, 9, lambda: "unused")
    assert at == past == WandbStart("aaaa1111", resume=True, replay_after=12)
    assert choose_run(record, args, 10, 12, lambda: next(ids)) == WandbStart(
        "new00002", parent="aaaa1111", fork_step=10, replay_after=10)
    killed = dict(record, synced_step=8)  # the last start was killed: W&B may lack steps 9-12
    assert choose_run(killed, args, 12, 12, lambda: "unused") == WandbStart("aaaa1111", resume=True, replay_after=8)
    assert choose_run(killed, args, 10, 12, lambda: next(ids)) == WandbStart(
        "new00003", parent="aaaa1111", fork_step=8, replay_after=8)
    moved = choose_run(record, WandbArgs(project="other", entity="team"), 12, 12, lambda: next(ids))
    assert moved == WandbStart("new00004", reason="logging.wandb's project or entity changed since run aaaa1111 "
                                                  "(team/p)")


def test_read_record_ignores_what_is_not_a_record(tmp_path):
    assert read_record(tmp_path) is None
    (tmp_path / RECORD).write_text("{not json")
    assert read_record(tmp_path) is None
    (tmp_path / RECORD).write_text('{"run_id": "abc"}')
    assert read_record(tmp_path) == {"run_id": "abc"}


# ------------------------------------------------------------------ one start, in process -------

def start(tmp_path, resumed=0, logged=0, args=None, lines=None):
    lines = [] if lines is None else lines
    return start_wandb(args or WandbArgs(project="p", mode="offline"), "demo", tmp_path, {"tokens": {
        "train_steps": 9}, "parameters": {"total": 3}}, resumed, logged, lines.append), lines


def test_a_fresh_start_a_continued_run_and_a_fork(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    fake_wandb(monkeypatch, log)
    first, lines = start(tmp_path)
    run_id = read_record(tmp_path)["run_id"]
    assert len(run_id) == 8 and lines == [f"wandb: new run {run_id}; offline: upload with `wandb sync fake/{run_id}`"]
    assert read_record(tmp_path) == {"run_id": run_id, "project": "p", "entity": None, "synced_step": 0}
    assert events(log)[0] == {"call": "init", "kwargs": {
        "project": "p", "entity": None, "name": "demo", "tags": [], "mode": "offline", "dir": str(tmp_path),
        "id": run_id}, "settings": {"silent": True, "console": "off"}, "parameters": {"total": 3},
        "forked_from": None, "train_steps": 9}
    first.log({"loss": 2.5}, 4)
    first.finish()
    assert read_record(tmp_path)["synced_step"] == 4  # finished: W&B has written every step it got
    again, lines = start(tmp_path, resumed=4, logged=4)
    assert lines == [f"wandb: continuing run {run_id} from step 4; offline: upload with `wandb sync fake/{run_id}`"]
    assert events(log)[-1]["kwargs"]["resume"] == "allow" and events(log)[-1]["kwargs"]["id"] == run_id
    fork, lines = start(tmp_path, resumed=2, logged=4)
    new = read_record(tmp_path)["run_id"]
    assert new != run_id and events(log)[-1]["kwargs"]["fork_from"] == f"{run_id}?_step=2"
    assert lines == [f"wandb: step 2 goes back from step 4 that run {run_id} has (W&B refuses steps that go "
                     f"backwards): run {new} forked from it at step 2; offline: upload with `wandb sync fake/{new}`"]
    assert [e["call"] for e in events(log)] == ["init", "log", "finish", "init", "init"]
    assert again.replay_after == 4 and fork.replay_after == 2  # the finished run had step 4: nothing to send again


def test_a_server_that_cannot_fork_gets_a_new_run_naming_its_parent(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    fake_wandb(monkeypatch, log)
    monkeypatch.setenv("FAKE_WANDB_NO_FORK", "1")
    (tmp_path / RECORD).write_text(json.dumps({"run_id": "parent01", "project": "p", "entity": None,
                                               "synced_step": 3}))
    run, lines = start(tmp_path, resumed=3, logged=5)
    new = read_record(tmp_path)["run_id"]
    (init,) = events(log)
    assert "fork_from" not in init["kwargs"] and init["forked_from"] == {"run": "parent01", "step": 3}
    assert lines == [f"wandb: step 3 goes back from step 5 that run parent01 has (W&B refuses steps that go "
                     f"backwards): run {new} is a new run naming it and step 3 in its config (forked_from; W&B "
                     f"could not fork it: RuntimeError: fork_from is not supported by this server); offline: "
                     f"upload with `wandb sync fake/{new}`"]


def test_no_package_no_network_and_a_failed_log_are_one_note_each(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert start(tmp_path) == (None, ["note: W&B logging is off: the wandb package is not installed (pip install "
                                      "-e '.[wandb]' in the checkout, or remove logging.wandb)"])
    fake_wandb(monkeypatch, tmp_path / "calls.jsonl")
    monkeypatch.setenv("FAKE_WANDB_FAIL_INIT", "1")
    assert start(tmp_path) == (None, ["note: W&B logging is off: wandb.init failed (ConnectionError: Network error "
                                      "(ConnectTimeout), entering retry loop); training goes on, metrics.jsonl "
                                      "keeps every row"])
    assert not (tmp_path / RECORD).exists()
    assert start(tmp_path, args=WandbArgs(project="p", mode="disabled")) == (None, [])
    lines = []
    broken = SimpleNamespace(id="x", log=lambda values, step: 1 / 0)
    logger = WandbLogger(broken, lines.append)
    logger.log({"loss": 1.0}, 7)
    logger.log({"loss": 1.0}, 8)  # said once; W&B is off from then on
    logger.finish()
    assert lines == ["note: W&B logging stopped at step 7 (ZeroDivisionError: division by zero); training goes on, "
                     "metrics.jsonl keeps every row"]


def test_scalars_are_tensorboards_names_for_every_row(tmp_path):
    """TensorBoard and W&B get the same names and values (one function): a row's numbers, per source its loss,
    share and other numbers, per validation set its numbers; nulls (a skipped step's) left out."""
    row = {"step": 3, "stage": "s", "loss": None, "lr": 1e-3, "grad_norm": None, "skipped": True,
           "tokens_per_s": 100.0, "data_hash": "ab", "mfu": None, "label_tokens": 40,
           "sources": {"shards/web": {"samples": 3, "label_tokens": 30, "loss": 2.0, "weight": 0.75},
                       "shards/code": {"samples": 1, "label_tokens": 0, "loss": None}}}
    assert scalars(row, NAMES) == {
        "lr": 1e-3, "skipped": True, "tokens_per_s": 100.0, "label_tokens": 40,
        "loss/web": 2.0, "mix/web": 0.75, "samples/web": 3, "label_tokens/web": 30, "weight/web": 0.75,
        "mix/code": 0.25, "samples/code": 1, "label_tokens/code": 0}
    val = {"step": 4, "stage": "s", "val": {"sft": {"loss": 2.5, "ppl": 12.18, "tokens": 40},
                                            "web": {"loss": None, "ppl": None, "tokens": 0}}}
    assert scalars(val, NAMES) == {"val/sft/loss": 2.5, "val/sft/ppl": 12.18, "val/sft/tokens": 40,
                                   "val/web/tokens": 0}
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    logged = []
    logger.wandb = SimpleNamespace(log=lambda values, step: logged.append((step, values)),
                                   finish=lambda failed: logged.append(("finish", failed)))
    logger.source_names = NAMES
    logger.log_validation(4, "s", val["val"], ["sft: ..."], seconds=0.5)
    logger.close(failed=True)
    assert logged == [(4, scalars(val, NAMES)), ("finish", True)] and logger.wandb is None


# ------------------------------------------------------------------ end to end ------------------

def config(tmp_path, run):
    """Two stages (pretrain 1-2, anneal from 3), checkpoints every 2 steps, validation every 2, W&B offline."""
    return small_config(tmp_path, run, dp=1, steps=8, boundary=3, interval=2,
                        logging={"tensorboard": False, "wandb": {"project": "nanoset-tests", "mode": "offline",
                                                                 "tags": ["ci"]}},
                        validation={"datasets": {"sft": "shards/sft"}, "interval": 2, "samples": 4})


def train(cfg, cwd, *sets, env=None):
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(cfg), *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=600)
    return proc


def three_starts(cfg, cwd, env):
    """Steps 1-4 (train_steps 4: its final checkpoint), then to 8, killed after step 7 (latest: step 6), then
    resumed at step 6: W&B may have step 7, so the last start forks, at step 4 (the last one a finished W&B run
    wrote), and sends steps 5 and 6 from metrics.jsonl."""
    first = train(cfg, cwd, "tokens.train_steps=4", env=env)
    assert first.returncode == 0, first.stderr
    second = train(cfg, cwd, env={**env, "NANOSET_FAULT_KILL_AT_STEP": "7"})
    assert second.returncode == -9, second.stderr
    third = train(cfg, cwd, env=env)
    assert third.returncode == 0, third.stderr
    return first, second, third


def expected_history(run: Path) -> dict[int, dict]:
    """metrics.jsonl as W&B should hold it: per step, its training row's scalars and its validation row's."""
    out: dict[int, dict] = {}
    for row in metrics(run):
        out.setdefault(row["step"], {}).update(scalars(row, NAMES))
    return out


def test_history_equals_metrics_across_a_resume_and_a_kill_through_a_fake_wandb(shards, tmp_path):
    run, log = tmp_path / "run", tmp_path / "calls.jsonl"
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]), "FAKE_WANDB_LOG": str(log)}
    first, second, third = three_starts(config(tmp_path, run), shards, env)
    calls = events(log)
    inits = [c for c in calls if c["call"] == "init"]
    parent, fork = inits[0]["kwargs"]["id"], inits[2]["kwargs"]["id"]
    assert inits[1]["kwargs"]["id"] == parent and inits[1]["kwargs"]["resume"] == "allow"
    assert fork != parent and inits[2]["kwargs"]["fork_from"] == f"{parent}?_step=4"
    assert [i["train_steps"] for i in inits] == [4, 8, 8] and inits[0]["kwargs"]["tags"] == ["ci"]
    p = parameter_count(SimpleNamespace(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_size=16,
                                        kv_heads=2, intermediate_size=64, vocab_size=1536, tie_word_embeddings=False))
    assert inits[0]["parameters"] == {"total": p.total, "embedding": p.embedding, "rest": p.rest} == {
        "total": 118_944, "embedding": 98_304, "rest": 20_640}
    logs = {run_id: [(c["step"], c["values"]) for c in calls if c["call"] == "log" and c["id"] == run_id]
            for run_id in (parent, fork)}
    steps = [s for s, _ in logs[parent]]
    assert steps == sorted(steps) and set(steps) == set(range(1, 8))  # never a step back within one W&B run
    assert [s for s, _ in logs[fork]] == [5, 6, 6, 7, 8, 8]  # 5 and 6 sent again; steps 6 and 8 are validated
    history: dict[int, dict] = {}
    for step, values in [(s, v) for s, v in logs[parent] if s <= 4] + logs[fork]:
        history.setdefault(step, {}).update(values)
    assert history == expected_history(run) and sorted(history) == list(range(1, 9))
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "loss/web", "mix/code", "samples/web"} <= set(history[1])
    assert {"val/sft/loss", "val/sft/ppl", "loss/sft"} <= set(history[4])
    assert [(c["id"], c["exit_code"]) for c in calls if c["call"] == "finish"] == [(parent, 0), (fork, 0)]
    assert f"wandb: continuing run {parent} from step 4; offline: upload with `wandb sync fake/{parent}`" in (
        second.stdout.splitlines())
    assert (f"wandb: step 6 goes back from step 7 that run {parent} has (W&B refuses steps that go backwards): "
            f"run {fork} forked from it at step 4; offline: upload with `wandb sync fake/{fork}`; steps 5-6 sent "
            f"from metrics.jsonl (W&B may lack them: no W&B run of this folder finished after them)") in (
        third.stdout.splitlines())
    assert read_record(run) == {"run_id": fork, "project": "nanoset-tests", "entity": None, "synced_step": 8}


# ------------------------------------------------------------------ the real offline files ------

def offline_records(path: Path):
    """The records of a W&B offline run file (``run-ID.wandb``): a 7-byte header (``:W&B``, magic, version),
    then LevelDB's log format (32 KiB blocks of chunks: CRC32, length, type; full, or first/middle/last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_history(run: Path, run_id: str) -> tuple[list[tuple[int, dict]], list]:
    """Every history row W&B wrote offline for ``run_id`` (each start of it has its own folder), in order, without
    W&B's own keys (``_step``, ``_runtime``, ...); and the run records (one per start)."""
    rows, runs = [], []
    for folder in sorted((run / "wandb").glob(f"offline-run-*-{run_id}")):
        for record in offline_records(folder / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                rows.append((record.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
            elif kind == "run":
                runs.append(record.run)
    return rows, runs


def test_the_real_offline_files_hold_metrics_jsonl(shards, tmp_path):
    """The real package, offline: the test extra installs it, so this runs wherever the suite does."""
    run = tmp_path / "run"
    env = {"WANDB_SILENT": "true"}
    three_starts(config(tmp_path, run), shards, env)
    folders = sorted((run / "wandb").glob("offline-run-*"))
    ids = [f.name.rsplit("-", 1)[1] for f in folders]
    parent, fork = ids[0], ids[2]
    assert ids[1] == parent and fork != parent and read_record(run)["run_id"] == fork
    parent_rows, parent_runs = offline_history(run, parent)
    fork_rows, fork_runs = offline_history(run, fork)
    steps = [s for s, _ in parent_rows]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # one W&B row per step, never a step back
    # the killed start's W&B files hold none of its steps (W&B had not written them): steps 5-6 come again
    assert set(range(1, 5)) <= set(steps) and [s for s, _ in fork_rows] == [5, 6, 7, 8]
    assert parent_runs[0].run_id == parent and fork_runs[0].project == "nanoset-tests"
    config_of_fork = {u.key: json.loads(u.value_json) for u in fork_runs[0].config.update}
    assert config_of_fork["_wandb"]["branch_point"] == {"run_id": parent, "step": 4}
    assert config_of_fork["parameters"] == {"total": 118_944, "embedding": 98_304, "rest": 20_640}
    assert config_of_fork["tokens"]["train_steps"] == 8 and list(fork_runs[0].tags) == ["ci"]
    history = dict([(s, v) for s, v in parent_rows if s <= 4] + fork_rows)
    assert history == expected_history(run)


@pytest.mark.parametrize("wandb, message", [
    ({"project": ""}, "logging.wandb.project: '' is empty; W&B takes 1-128 characters, none of / \\ # ? % :"),
    ({"project": "team/p"}, "logging.wandb.project: 'team/p' contains /; W&B takes 1-128 characters, none of "
                            "/ \\ # ? % :"),
    ({"project": "p" * 129}, f"logging.wandb.project: {'p' * 129!r} is over 128 characters; W&B takes 1-128 "
                             f"characters, none of / \\ # ? % :"),
    ({"project": "p", "name": ""}, "logging.wandb.name: empty; give one or remove the key"),
    ({"project": "p", "entity": ""}, "logging.wandb.entity: empty; give one or remove the key"),
    ({"project": "p", "tags": ["ok", "t" * 65]}, f"logging.wandb.tags[1]: {'t' * 65!r} has 65 characters; W&B takes "
                                                 f"tags of 1-64"),
    ({"project": "p", "mode": "local"}, "logging.wandb.mode: 'local' is not one of ['online', 'offline', 'disabled']"),
])
def test_settings_wandb_would_refuse_are_one_line_before_the_run(wandb, message):
    """W&B refusing them at start-up would only stop the logging with a note; the config says them first."""
    from runtime.config import ConfigError
    from tests.support.configs import TINY, build, merged

    with pytest.raises(ConfigError) as e:
        build(merged(TINY, logging={"wandb": wandb}))
    assert str(e.value) == message
