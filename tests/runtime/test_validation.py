"""Validation loss: the fixed held-out sample set, layout-invariant values, metrics rows,
``runtime.evaluate`` on a checkpoint, and one-line config errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from nanoset import open_dataset
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.data.loading.feed import validation_batches
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.validation_sets import open_validation_sets
from runtime.observe.metrics import MetricsLogger
from runtime.validation import describe
from tests.support import TOKENIZER, run_cli
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, run_distributed, torchrun, train_one
from tests.support.validation_workers import evaluate_in_layout, train_with_slow_evaluations


def with_validation(cfg: Path, **validation) -> Path:
    d = yaml.safe_load(cfg.read_text())
    d["validation"] = validation
    cfg.write_text(yaml.safe_dump(d))
    return cfg


def evaluate_cli(cfg: Path, checkpoint: Path, cwd: Path, *extra: str, nproc: int = 1) -> subprocess.CompletedProcess:
    launch = ["-m", "runtime.evaluate"] if nproc == 1 else [
        "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "runtime.evaluate"]
    return subprocess.run([sys.executable, *launch, "--config", str(cfg), "--checkpoint",
                           str(checkpoint), *extra], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def rank_of(dp_rank: int, dp_size: int, pp_rank: int = 0, pp_size: int = 1) -> SimpleNamespace:
    """A rank of a layout without tp or cp: it reads its replica's rows itself."""
    return SimpleNamespace(dp_rank=dp_rank, dp_size=dp_size, pp_rank=pp_rank, pp_size=pp_size, tp_rank=0, tp_size=1,
                           cp_rank=0, cp_size=1)


# ---------------------------------------------------------------- the sample set -------------------


def test_sample_set_is_the_seeded_permutation_prefix_whatever_the_stages(shards, tmp_path, monkeypatch):
    monkeypatch.chdir(shards)
    cfg = with_validation(small_config(tmp_path, tmp_path / "run"), samples=5,
                          datasets={"mix": ["shards/sft", "shards/code"]})
    (held,) = open_validation_sets(load_config(cfg))
    sft, code = open_dataset("shards/sft"), open_dataset("shards/code")
    n_sft, n_code = (sft.num_tokens - 1) // 16, (code.num_tokens - 1) // 16
    ids = held.sample_ids(16)
    expected = FeistelPermutation(n_sft + n_code, "validation", 42, [sft.fingerprint, code.fingerprint], 16)(
        np.arange(5))
    assert ids.tolist() == expected.tolist() and len(set(ids.tolist())) == 5
    # each id reads the window of the concatenated folders: sft's windows, then code's
    tokens = [ex["input_ids"].tolist() for ex in held.examples(16, ids, use_position_ids=False)]
    for i, row in zip(ids.tolist(), tokens):
        reader, w = (sft, i) if i < n_sft else (code, i - n_sft)
        assert row == reader.tokens(w * 16, w * 16 + 17).tolist()
    # a prefix: more samples extend the set; other training stages (folders, seed, batch) change nothing
    other = with_validation(small_config(tmp_path, tmp_path / "run2", dp=1, accum=3, single_stage=True,
                                         name="other.yaml", general={"seed": 42}), samples=9,
                            datasets={"mix": ["shards/sft", "shards/code"]})
    d = yaml.safe_load(other.read_text())
    d["data_stages"][0]["data"].update(seed=7, dataset={"dataset_folder": "shards/web"})
    other.write_text(yaml.safe_dump(d))
    (held9,) = open_validation_sets(load_config(other))
    assert held9.sample_ids(16)[:5].tolist() == ids.tolist()
    # the validation seed changes the set
    reseeded = with_validation(small_config(tmp_path, tmp_path / "run3", name="seeded.yaml"), samples=5, seed=1,
                               datasets={"mix": ["shards/sft", "shards/code"]})
    assert open_validation_sets(load_config(reseeded))[0].sample_ids(16).tolist() != ids.tolist()


def test_batches_follow_the_contract_and_pad_with_masked_labels(shards, tmp_path, monkeypatch):
    """5 samples, dp 2 × micro-batch 2 × accumulation 2 = 8 rows per step: one step, 3 padding rows."""
    monkeypatch.chdir(shards)
    cfg = with_validation(small_config(tmp_path, tmp_path / "run"), samples=5, datasets={"sft": "shards/sft"})
    (held,) = open_validation_sets(load_config(cfg))
    ids = held.sample_ids(16)
    rows, masks = {}, {}
    for dp_rank in (0, 1):
        (step,) = list(validation_batches(held, 16, True, rank_of(dp_rank, 2), micro_batch_size=2, accumulation=2))
        for m, batch in enumerate(step):
            for i in range(2):
                g = m * 4 + dp_rank * 2 + i  # the row's place in the global batch
                rows[g] = batch["label_ids"][i].tolist()
                masks[g] = batch["label_mask"][i].tolist()
    expected = [ex["input_ids"][1:].tolist() for ex in held.examples(16, ids, True)]
    assert [rows[g] for g in range(5)] == expected
    assert [any(masks[g]) for g in range(8)] == [True] * 5 + [False] * 3
    middle = rank_of(0, 2, pp_rank=1, pp_size=3)  # owns no data: pointers only
    (step,) = list(validation_batches(held, 16, True, middle, micro_batch_size=2, accumulation=2))
    assert {type(v).__name__ for b in step for v in b.values()} == {"TensorPointer"}


def test_loss_masks_of_chat_folders_count_as_in_training(shards, chat_shards, tmp_path, monkeypatch):
    """A set of a chat folder (``.ds.loss``) and a plain one: a label counts when its target token is
    trained on (``loss[1:]``) and, with position ids, does not start a document."""
    monkeypatch.chdir(shards)
    cfg = with_validation(small_config(tmp_path, tmp_path / "run"), samples=6,
                          datasets={"mixed": [str(chat_shards), "shards/sft"]})
    (held,) = open_validation_sets(load_config(cfg))
    chat, sft = open_dataset(chat_shards), open_dataset("shards/sft")
    n_chat = (chat.num_tokens - 1) // 16
    ids = held.sample_ids(16)
    assert 0 < (ids < n_chat).sum() < 6  # windows of both folders
    (step,) = list(validation_batches(held, 16, True, rank_of(0, 1), micro_batch_size=3, accumulation=2))
    got = np.concatenate([b["label_mask"].numpy() for b in step])
    for row, i in zip(got, ids.tolist()):
        reader, w = (chat, i) if i < n_chat else (sft, i - n_chat)
        start = w * 16
        starts = set((reader.document_starts(start, start + 17) - start).tolist())
        trained = reader.loss_mask(start + 1, start + 17) if reader is chat else np.ones(16, dtype=bool)
        assert row.tolist() == [bool(trained[t]) and (t + 1) not in starts for t in range(16)]
    assert 0 < got[ids < n_chat].sum() < (ids < n_chat).sum() * 16  # prompts are not counted


# ---------------------------------------------------------------- layouts -------------------------

LAYOUTS = {
    "dp2": ({"dp": 2}, False),
    "tp2": ({"tp": 2}, False),
    "pp2-1f1b": ({"pp": 2, "pp_engine": "1f1b"}, False),
    "pp2-interleaved": ({"pp": 2, "pp_engine": "interleaved-1f1b", "pp_virtual_stages": 2}, False),
    "pp2-without-schedule-eval": ({"pp": 2, "pp_engine": "afab"}, True),
    "pp2-interleaved-without-schedule-eval": ({"pp": 2, "pp_engine": "interleaved-1f1b", "pp_virtual_stages": 2},
                                              True),
}


@pytest.fixture(scope="module")
def layout_config(shards, tmp_path_factory):
    folder = tmp_path_factory.mktemp("layouts")
    cfg = small_config(folder, folder / "run", dp=1, accum=2, single_stage=True,
                       model={"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2})
    return with_validation(cfg, samples=7, datasets={"sft": [str(shards / "shards" / "sft")],
                                                      "web": str(shards / "shards" / "web")})


@pytest.fixture(scope="module")
def single_process(layout_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "val"
    run_distributed(1, evaluate_in_layout, str(layout_config), {}, str(out), False)
    return json.loads(Path(f"{out}.rank0").read_text())


def test_single_process_values(layout_config, single_process):
    # 7 windows of 32 tokens, position ids on: the labels that do not start a new document count
    assert list(single_process) == ["sft", "web"]
    for held in open_validation_sets(load_config(layout_config)):
        r = single_process[held.name]
        examples = held.examples(32, held.sample_ids(32), use_position_ids=True)
        assert len(examples) == 7 and r["tokens"] == sum(int((ex["position_ids"][1:] != 0).sum()) for ex in examples)
        assert abs(r["loss"] - math.log(1536)) < 0.5  # an untrained model: about uniform
        assert r["ppl"] == pytest.approx(math.exp(r["loss"]), rel=1e-12)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_gives_the_single_process_value(layout_config, single_process, tmp_path, name):
    layout, without_eval = LAYOUTS[name]
    world = layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
    run_distributed(world, evaluate_in_layout, str(layout_config), layout, str(tmp_path / "val"), without_eval)
    for rank in range(world):
        got = json.loads((tmp_path / f"val.rank{rank}").read_text())
        assert list(got) == list(single_process)
        for ds, ref in single_process.items():
            assert got[ds]["tokens"] == ref["tokens"]
            assert abs(got[ds]["loss"] - ref["loss"]) < 1e-5, (name, rank, ds, got[ds], ref)


# ---------------------------------------------------------------- training and the CLI --------------


@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory):
    """dp 2, stages at steps 1-3 (seq 32) and 4-6 (seq 16), validation every 2 steps and at stage ends."""
    folder = tmp_path_factory.mktemp("trained")
    run = folder / "run"
    cfg = with_validation(small_config(folder, run, steps=6, boundary=4, interval=3), interval=2, samples=5,
                          datasets={"sft": "shards/sft", "web": "shards/web"})
    proc = torchrun(cfg, 2, cwd=shards)
    return cfg, run, proc


def test_metrics_rows_and_log_lines(trained):
    cfg, run, proc = trained
    rows = metrics(run)
    val = [r for r in rows if "val" in r]
    assert [(r["step"], r["stage"]) for r in val] == [(2, "pretrain"), (3, "pretrain"), (4, "anneal"), (6, "anneal")]
    assert [r["step"] for r in rows if "val" not in r] == [1, 2, 3, 4, 5, 6]
    for r in val:
        assert set(r) == {"step", "stage", "val"} and list(r["val"]) == ["sft", "web"]
        for v in r["val"].values():
            assert set(v) == {"loss", "ppl", "tokens", "sequence_length"}
            assert v["ppl"] == pytest.approx(math.exp(v["loss"])) and v["sequence_length"] == 32
    # one sample set at one length for the whole run: the anneal stage's 16 does not change it (5 windows of 32)
    assert len({r["val"]["sft"]["tokens"] for r in val}) == 1 and val[0]["val"]["sft"]["tokens"] <= 5 * 32
    assert val[3]["val"]["sft"]["loss"] < val[2]["val"]["sft"]["loss"]  # it trains on sft in the anneal stage
    lines = [line for line in proc.stdout.splitlines() if line.startswith("val ")]
    assert len(lines) == 4 and lines[0].startswith("val       2 | pretrain | sft: loss ")


@pytest.mark.parametrize("checkpoint, nproc", [("step-000003", 1), ("latest", 1), ("latest", 2)])
def test_evaluate_cli_gives_the_in_training_value(trained, shards, checkpoint, nproc):
    """One process (the dp = 2 checkpoint resharded), or torchrun with the config's dp = 2."""
    cfg, run, _ = trained
    step = 3 if checkpoint == "step-000003" else 6
    path = run / "checkpoints" / (checkpoint if checkpoint != "latest" else "")
    proc = evaluate_cli(cfg, path, shards, "--json", nproc=nproc)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    (logged,) = [r for r in metrics(run) if "val" in r and r["step"] == step]
    assert row["step"] == step and row["stage"] == logged["stage"]
    for name, v in logged["val"].items():
        assert row["val"][name]["tokens"] == v["tokens"]
        assert abs(row["val"][name]["loss"] - v["loss"]) < 1e-5
    text = evaluate_cli(cfg, path, shards)
    assert [line.split(": loss")[0] for line in text.stdout.splitlines()] == ["sft", "web"]


def test_evaluate_cli_on_a_torn_checkpoint_is_one_line(trained, shards, tmp_path):
    """DCP's CheckpointException (a BaseException) escaped runtime.evaluate as a traceback."""
    cfg, run, _ = trained
    torn = tmp_path / "step-000003"
    shutil.copytree(run / "checkpoints" / "step-000003", torn)
    victim = sorted(torn.glob("*.distcp"))[-1]
    victim.unlink()
    proc = evaluate_cli(cfg, torn, shards)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {torn}: the DCP files are unreadable ([Errno 2] No such file or directory: '{victim}'); choose "
        f"another checkpoint\n")


def test_resumed_run_logs_each_validation_once_with_the_same_values(trained, shards, tmp_path):
    """Resumed from the step-3 checkpoint: steps 4-6 are trained and evaluated again, their rows replaced."""
    cfg, run, _ = trained
    first = metrics(run)
    again = tmp_path / "run"
    shutil.copytree(run, again)
    d = yaml.safe_load(cfg.read_text())
    d["general"]["run_dir"] = str(again)
    d["checkpoints"]["resume"] = str(again / "checkpoints" / "step-000003")
    resumed = tmp_path / "resumed.yaml"
    resumed.write_text(yaml.safe_dump(d))
    torchrun(resumed, 2, cwd=shards)
    rows = metrics(again)
    assert [(r["step"], "val" in r) for r in rows] == [(1, False), (2, False), (2, True), (3, False), (3, True),
                                                       (4, False), (4, True), (5, False), (6, False), (6, True)]
    for a, b in zip(first, rows):
        if "val" in a:
            assert a["val"].keys() == b["val"].keys()
            for name in a["val"]:
                assert abs(a["val"][name]["loss"] - b["val"][name]["loss"]) < 1e-6


def test_tokens_per_second_leaves_evaluations_out(shards, tmp_path, monkeypatch):
    monkeypatch.chdir(shards)
    cfg = with_validation(small_config(tmp_path, tmp_path / "run", dp=1, steps=3, single_stage=True),
                          interval=1, samples=2, datasets={"sft": "shards/sft"})
    run_distributed(1, train_with_slow_evaluations, str(cfg), str(tmp_path))
    rows = [r for r in metrics(tmp_path / "run") if "val" not in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    tokens_per_step = 2 * 32  # dp 1 · micro-batch 2 · accumulation 1 samples of 32 tokens
    assert all(r["tokens_per_s"] > tokens_per_step / 1.5 for r in rows[1:])  # a step, not a step + 2 s evaluation


def test_validation_rows_tensorboard_and_log_line(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    scalars = []
    logger.tb = SimpleNamespace(add_scalar=lambda *a: scalars.append(a))
    results = {"web": {"loss": 2.5, "ppl": math.exp(2.5), "tokens": 40},
               "chat": {"loss": 1.0, "ppl": math.e, "tokens": 7}}
    logger.log_validation(8, "anneal", results, describe(results))
    assert metrics(tmp_path) == [{"step": 8, "stage": "anneal", "val": results}]
    assert scalars == [("val/web/loss", 2.5, 8), ("val/web/ppl", math.exp(2.5), 8), ("val/web/tokens", 40, 8),
                       ("val/chat/loss", 1.0, 8), ("val/chat/ppl", math.e, 8), ("val/chat/tokens", 7, 8)]
    assert capsys.readouterr().out == ("val       8 | anneal | web: loss 2.5000 ppl 12.18 tokens 40 | "
                                       "chat: loss 1.0000 ppl 2.72 tokens 7\n")


def test_a_set_without_label_tokens_is_a_json_row_and_says_so(tmp_path, capsys):
    """Chat windows sampled in user turns only: loss was NaN and ppl inf, written as NaN/Infinity (not JSON)."""
    from runtime.validation import summarize

    results = {"chat": summarize(0.0, 0), "web": summarize(5.0, 2)}
    assert results == {"chat": {"loss": None, "ppl": None, "tokens": 0},
                       "web": {"loss": 2.5, "ppl": math.exp(2.5), "tokens": 2}}
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    scalars = []
    logger.tb = SimpleNamespace(add_scalar=lambda *a: scalars.append(a))
    logger.log_validation(4, "sft", results, describe(results))
    row = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert row["val"]["chat"] == {"loss": None, "ppl": None, "tokens": 0}
    assert scalars == [("val/chat/tokens", 0, 4), ("val/web/loss", 2.5, 4), ("val/web/ppl", math.exp(2.5), 4),
                       ("val/web/tokens", 2, 4)]
    assert capsys.readouterr().out == ("val       4 | sft | chat: no label tokens (raise validation.samples) | "
                                       "web: loss 2.5000 ppl 12.18 tokens 2\n")


def test_a_non_finite_validation_loss_is_null_in_metrics_and_left_out_of_tensorboard(tmp_path, capsys):
    """A diverged model's validation loss: metrics.jsonl got `NaN` (not JSON), TensorBoard a NaN scalar, and the
    log line said `loss nan ppl overflow`. It is null, as a skipped training step's loss is."""
    from runtime.validation import summarize

    results = {"web": summarize(float("nan"), 40), "code": summarize(float("inf"), 8), "chat": summarize(2.0, 4)}
    assert results == {"web": {"loss": None, "ppl": None, "tokens": 40},
                       "code": {"loss": None, "ppl": None, "tokens": 8},
                       "chat": {"loss": 0.5, "ppl": math.exp(0.5), "tokens": 4}}
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    scalars = []
    logger.tb = SimpleNamespace(add_scalar=lambda *a: scalars.append(a))
    logger.log_validation(6, "pretrain", results, describe(results))
    # a row handed over with a NaN in it (e.g. by code that does not summarize) is written as null all the same
    logger.log_validation(7, "pretrain", {"web": {"loss": float("nan"), "ppl": float("inf"), "tokens": 40}},
                          ["web: nan"])
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(c))
            for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 6, "stage": "pretrain", "val": results},
                    {"step": 7, "stage": "pretrain", "val": {"web": {"loss": None, "ppl": None, "tokens": 40}}}]
    assert scalars == [("val/web/tokens", 40, 6), ("val/code/tokens", 8, 6), ("val/chat/loss", 0.5, 6),
                       ("val/chat/ppl", math.exp(0.5), 6), ("val/chat/tokens", 4, 6), ("val/web/tokens", 40, 7)]
    assert capsys.readouterr().out == (
        "val       6 | pretrain | web: loss not finite (NaN or infinity) tokens 40 | code: loss not finite (NaN or "
        "infinity) tokens 8 | chat: loss 0.5000 ppl 1.65 tokens 4\n"
        "val       7 | pretrain | web: nan\n")


def test_resume_keeps_one_validation_row_per_step(tmp_path):
    rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 2, "stage": "a", "val": {"x": 1}},
            {"step": 3, "loss": 3.0}, {"step": 4, "loss": 4.0}, {"step": 4, "stage": "a", "val": {"x": 2}},
            {"step": 2, "loss": 12.0}, {"step": 2, "stage": "a", "val": {"x": 3}}]  # step 2 trained again
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    MetricsLogger(tmp_path, enabled=True, tensorboard=False).truncate_after(3)
    assert metrics(tmp_path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 12.0},
                                 {"step": 2, "stage": "a", "val": {"x": 3}}, {"step": 3, "loss": 3.0}]


# ---------------------------------------------------------------- mistakes ------------------------


@pytest.mark.parametrize("validation, fragment", [
    ({"datasets": {"v": "shards/sft"}, "samples": 0}, "validation.samples: must be > 0, got 0"),
    ({"datasets": {"v": "shards/sft"}, "interval": -1}, "validation.interval: must be ≥ 0, got -1"),
    ({"interval": 10}, "validation.interval is 10 but validation.datasets is empty; name at least one dataset"),
    ({"datasets": {"v": "shards/sft"}, "sample": 3}, "validation.sample: unknown key; did you mean 'samples'?"),
    ({"datasets": ["shards/sft"]}, "validation.datasets: expected a mapping, got ['shards/sft']"),
    ({"datasets": {"v": []}}, "validation.datasets.v: give a dataset name and at least one folder"),
    ({"datasets": {"v": ["shards/sft", "./shards/sft"]}}, "validation.datasets.v: a folder is listed twice"),
])
def test_config_mistakes(shards, tmp_path, validation, fragment):
    cfg = with_validation(small_config(tmp_path, tmp_path / "run"), **validation)
    with pytest.raises(ConfigError, match=None) as e:
        load_config(cfg)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_data_mistakes_are_one_line_before_start_up(shards, tmp_path):
    cfg = with_validation(small_config(tmp_path, tmp_path / "run", dp=1), datasets={"v": "shards/nope"})
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1 and len(error_lines(proc.stderr)) == 1
    assert error_lines(proc.stderr)[0].startswith("error: validation.datasets.v: shards/nope")
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "a.jsonl").write_text('{"text": "hi"}\n')
    run_cli("tokenize", tmp_path / "tiny", "-o", tmp_path / "tiny-ds", "--tokenizer", TOKENIZER, "--quiet")
    tokens = open_dataset(tmp_path / "tiny-ds").num_tokens
    short = with_validation(small_config(tmp_path, tmp_path / "run", dp=1, name="short.yaml"),
                            datasets={"t": str(tmp_path / "tiny-ds")})
    proc = train_one(short, shards, check=False)
    assert proc.returncode == 1 and error_lines(proc.stderr) == [
        f"error: validation.datasets.t: {tokens} tokens, too few for one window of 33 (the validation sequence "
        f"length + 1); add data or lower validation.sequence_length"]
    other = tmp_path / "other-tokenizer"
    shutil.copytree(shards / "shards" / "sft", other)
    manifest = json.loads((other / "nanoset.json").read_text())
    manifest["tokenizer"].update(name="other", sha256="f" * 64)
    (other / "nanoset.json").write_text(json.dumps(manifest))
    mixed = with_validation(small_config(tmp_path, tmp_path / "run", dp=1, name="mixed.yaml"),
                            datasets={"v": str(other)})
    proc = train_one(mixed, shards, check=False)
    web = open_dataset(shards / "shards" / "web").tokenizer.describe()
    assert proc.returncode == 1 and error_lines(proc.stderr) == [
        f"error: validation.datasets.v: {other} was tokenized with 'other' sha256 ffffffffffff, but shards/web with "
        f"{web}; validation data must be made with the training tokenizer"]
    bad = evaluate_cli(cfg, tmp_path / "missing", shards)
    assert bad.returncode == 1 and bad.stderr == f"error: --checkpoint {tmp_path}/missing: no such folder\n"
    empty = evaluate_cli(small_config(tmp_path, tmp_path / "run", dp=1, name="none.yaml"), tmp_path, shards)
    assert empty.returncode == 1 and empty.stderr == (f"error: {tmp_path}/none.yaml: validation.datasets is empty; "
                                                      f"name the datasets to evaluate on there, or pass --dataset "
                                                      f"FOLDER (or --task FILE)\n")


def test_tied_pipeline_run_evaluates_the_same_in_one_process(shards, tmp_path):
    """Tied embeddings at pp = 2 (the head a copy of the embedding on the last stage): the checkpoint
    holds the weight once, and ``runtime.evaluate`` in one process (head and embedding one parameter
    again) gives the in-training values; it used to ask the checkpoint for a ``lm_head.weight``."""
    run = tmp_path / "run"
    cfg = with_validation(small_config(tmp_path, run, dp=1, accum=2, steps=4, boundary=3, interval=4,
                                       parallelism={"pp": 2}, model={"tie_word_embeddings": True}),
                          interval=4, samples=4, datasets={"sft": "shards/sft"})
    torchrun(cfg, 2, cwd=shards)
    (logged,) = [r for r in metrics(run) if "val" in r and r["step"] == 4]
    single = yaml.safe_load(cfg.read_text())
    single["parallelism"]["pp"] = 1
    (tmp_path / "single.yaml").write_text(yaml.safe_dump(single))
    proc = evaluate_cli(tmp_path / "single.yaml", run / "checkpoints", shards, "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert (row["step"], row["stage"]) == (4, "anneal")
    assert row["val"]["sft"]["tokens"] == logged["val"]["sft"]["tokens"] > 0
    assert abs(row["val"]["sft"]["loss"] - logged["val"]["sft"]["loss"]) < 1e-5


def test_the_plot_breaks_a_validation_series_where_what_it_measures_changes():
    from runtime.observe.metrics_plot import validation_segments

    def row(step, loss, length, tokens=100):
        return {"step": step, "stage": "s", "val": {"web": {"loss": loss, "ppl": 1.0, "tokens": tokens,
                                                            "sequence_length": length}}}

    val = [row(2, 3.0, 32), row(4, 2.9, 32), row(6, 2.5, 64), row(8, 2.4, 64), row(10, None, 64),
           row(12, 2.3, 64, tokens=90), row(14, 2.2, 64, tokens=90)]
    assert validation_segments(val, "web") == [[(2, 3.0), (4, 2.9)], [(6, 2.5), (8, 2.4)], [(12, 2.3), (14, 2.2)]]
    assert validation_segments(val, "other") == []


def test_one_validation_sequence_length_for_the_run(tmp_path):
    """The first stage's by default, whatever the later stages' lengths; validation.sequence_length sets it."""
    assert load_config(small_config(tmp_path, tmp_path / "run")).validation_sequence_length == 32  # then 16
    cfg = with_validation(small_config(tmp_path, tmp_path / "run", name="set.yaml"), sequence_length=16,
                          datasets={"sft": "shards/sft"})
    assert load_config(cfg).validation_sequence_length == 16
