"""The console: the parameter count and the tokens to train at start-up, `step N/TOTAL` with the elapsed time and an
ETA on every step line (a moving average that leaves validation and checkpoint saves out), how long a validation
and a checkpoint took, and the elapsed time on the final line."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from runtime.config.schema import ModelArgs
from runtime.control.progress import Progress, StageSpan, clock, describe_tokens, duration, tokens_to_train
from runtime.models.llama import LlamaChunk
from runtime.observe.metrics import MetricsLogger, parameter_count
from tests.support.configs import small_config
from tests.support.harness import train_one


def test_clock_and_duration():
    assert [clock(s) for s in (0, 59.4, 59.6, 61, 3599.4, 3600, 97384)] == [
        "0:00", "0:59", "1:00", "1:01", "59:59", "1:00:00", "27:03:04"]
    assert [duration(s) for s in (0.004, 0.42, 9.994, 12.34, 75)] == ["0.00 s", "0.42 s", "9.99 s", "12.3 s", "1:15"]


def test_the_eta_is_a_moving_average_of_step_times_times_the_steps_left():
    times = iter([100.0, 102.0, 130.0, 136.0, 150.0])
    progress = Progress(40, window=2, now=lambda: next(times))  # started at 100
    assert progress.step_done(1, 2.0) == "elapsed 0:02 | eta 1:18"  # 2 s × 39 steps
    # 28 s went by, 24 of them a validation and a save: the step took 4 s, and the ETA counts 4, not 28
    assert progress.step_done(2, 4.0) == "elapsed 0:30 | eta 1:54"  # (2 + 4) / 2 × 38
    assert progress.step_done(3, 6.0) == "elapsed 0:36 | eta 3:05"  # the window holds two: (4 + 6) / 2 × 37
    assert progress.step_done(40, 6.0) == "elapsed 0:50 | eta 0:00"


def test_the_eta_is_per_stage_from_the_rate_scaled_by_each_stage_tokens_per_step():
    """Pretrain steps 1-10 at 1,000 tokens a step, then SFT steps 11-20 at 4× the tokens per step: at 2 s a pretrain
    step (2 ms a token), an SFT step will take 8 s."""
    times = iter([0.0, 2.0, 20.0, 30.0])
    stages = [StageSpan("pretrain", 1, 11, 1000), StageSpan("sft", 11, 21, 4000)]
    progress = Progress(20, window=2, now=lambda: next(times), stages=stages)
    assert progress.step_done(1, 2.0) == "elapsed 0:02 | eta 1:38 (pretrain 0:18, sft 1:20)"  # 9 × 2 s + 10 × 8 s
    # in the SFT stage the rate is measured again: 16 s for 4,000 tokens is 4 ms a token, averaged with 2 ms
    assert progress.step_done(11, 16.0) == "elapsed 0:20 | eta 1:48"  # 9 steps × 4,000 × 3 ms, one stage left


def test_the_step_line_and_the_validation_line(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, enabled=True, tensorboard=False)
    logger.train_steps = 400
    row = {"step": 12, "stage": "pretrain", "loss": 3.14159, "lr": 3e-4, "grad_norm": 0.5, "skipped": False,
           "tokens_per_s": 12345.6, "data_wait_ms": 1.25, "mfu": 0.4321}
    logger.log(row, "elapsed 1:02 | eta 33:20")
    logger.log_validation(12, "pretrain", {"web": {"loss": 2.5, "ppl": 12.18, "tokens": 40}}, ["web: loss 2.5000"],
                          seconds=1.5)
    assert capsys.readouterr().out.splitlines() == [
        "step     12/400 | pretrain | loss 3.1416 | lr 3.000e-04 | grad_norm 0.500 | tokens/s 12,346 | data_wait "
        "1.2 ms | mfu 43.2% | elapsed 1:02 | eta 33:20",
        "val      12 | pretrain | web: loss 2.5000 | took 1.50 s"]


@pytest.mark.parametrize("model", [
    {"tie_word_embeddings": False},
    {"tie_word_embeddings": True},
    {"num_key_value_heads": 1, "head_dim": 24},  # grouped-query attention, heads of another width than h / heads
])
def test_the_parameter_count_is_the_models(model):
    args = ModelArgs(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=80,
                     vocab_size=500, max_position_embeddings=64, **model)
    chunk = LlamaChunk(args)
    count = parameter_count(args)
    assert count.total == sum(p.numel() for p in chunk.parameters())  # a tied head counted once
    embedding = [chunk.embed_tokens.weight] + ([] if args.tie_word_embeddings else [chunk.lm_head.weight])
    assert count.embedding == sum(p.numel() for p in embedding) == 500 * 32 * (1 if args.tie_word_embeddings else 2)
    assert count.rest == sum(p.numel() for name, p in chunk.named_parameters()
                             if name not in ("embed_tokens.weight", "lm_head.weight"))


def test_the_parameter_line():
    args = SimpleNamespace(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, head_size=128, kv_heads=8,
                           intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
    assert parameter_count(args).describe() == (  # Llama 3 8B
        "model: 8,030,261,248 parameters (8.03B): embedding 1,050,673,152 (input embedding and output head) + the "
        "rest 6,979,588,096")
    tied = SimpleNamespace(**{**vars(args), "tie_word_embeddings": True})
    assert parameter_count(tied).describe().endswith("embedding 525,336,576 (tied with the output head) + the rest "
                                                     "6,979,588,096")


def part(name, start, end, batch, length):
    return SimpleNamespace(name=name, start_step=start, end_step=end, global_batch_size=batch, sequence_length=length)


def test_the_tokens_to_train():
    """A stage a resume split in two parts (another global batch from step 36) is one stage."""
    plan = SimpleNamespace(stages=[part("pretrain", 1, 31, 8, 128), part("anneal", 31, 36, 8, 64),
                                   part("anneal", 36, 41, 16, 64)])
    assert tokens_to_train(plan, 0) == [("pretrain", 30 * 8 * 128), ("anneal", 5 * 8 * 64 + 5 * 16 * 64)]
    assert describe_tokens(plan, 0, 40) == "tokens: 38,400 to train in steps 1-40 (pretrain 30,720, anneal 7,680)"
    assert describe_tokens(plan, 33, 40) == "tokens: 6,144 to train in steps 34-40"  # 2 × 8 × 64 + 5 × 16 × 64
    assert describe_tokens(plan, 40, 40) == "tokens: none to train (step 40 of 40 is done)"


def test_a_run_says_its_size_progress_and_durations(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, boundary=5, interval=3,
                       validation={"datasets": {"sft": "shards/sft"}, "interval": 2, "samples": 4})
    lines = train_one(cfg, shards).stdout.splitlines()
    assert lines.pop(0).startswith("warning: validation.datasets.sft: shards/sft is also training data")  # anneal's
    assert lines[:2] == [
        "model: 118,944 parameters (0.12M): embedding 98,304 (input embedding and output head) + the rest 20,640",
        "tokens: 320 to train in steps 1-6 (pretrain 256, anneal 64)"]  # 4 × 2 × 32 + 2 × 2 × 16
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split(" |")[0] for line in steps] == [f"step {i:6d}/6" for i in range(1, 7)]
    both = r" \(pretrain \d+:\d\d, anneal \d+:\d\d\)"  # an ETA per stage while both are left (steps 1-3)
    assert [bool(re.search(rf" \| elapsed \d+:\d\d \| eta \d+:\d\d{both}$", line)) for line in steps] == [True] * 3 + [
        False] * 3
    assert all(re.search(r" \| elapsed \d+:\d\d \| eta \d+:\d\d$", line) for line in steps[3:])
    assert steps[-1].endswith("| eta 0:00")
    val = [line for line in lines if line.startswith("val ")]
    assert len(val) == 3 and all(re.fullmatch(r"val +\d \| \w+ \| sft: loss .* \| took \d+\.\d\d s", v) for v in val)
    saved = [line for line in lines if line.startswith("checkpoint ")]
    assert [re.sub(r"saved in \d+\.\d\d s$", "saved in T", line) for line in saved] == [
        f"checkpoint {run / 'checkpoints' / f'step-{s:06d}'} saved in T" for s in (3, 6)]
    assert lines.index(saved[0]) == lines.index(steps[2]) + 1  # after step 3, before step 4
    assert re.fullmatch(r"done: step 6/6 in \d+:\d\d; final loss per stage: pretrain \d\.\d{4}, anneal \d\.\d{4}; "
                        r"checkpoint: .*step-000006; metrics: .*metrics.jsonl", lines[-1])
    resumed = train_one(small_config(tmp_path, run, dp=1, steps=8, boundary=5, interval=3, name="more.yaml"),
                        shards).stdout.splitlines()
    assert "tokens: 64 to train in steps 7-8" in resumed  # 2 steps × 2 × 16, the anneal stage's
    assert [line.split(" |")[0] for line in resumed if line.startswith("step ")] == ["step      7/8", "step      8/8"]
