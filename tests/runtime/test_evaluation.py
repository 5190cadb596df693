"""Evaluation during training: multiple-choice tasks scored by lm-evaluation-harness's log-likelihood rule, equal
to transformers on the exported model; the rows and batches; bad task files and hooks in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from nanoset import TokenizerInfo
from nanoset.errors import ConfigError
from runtime.config.load import load_config
from runtime.evaluation.evaluator import open_tasks
from runtime.evaluation.scoring import row_tensors, task_batches
from runtime.evaluation.tasks import Request, Task, TaskItem, task_metrics
from tests.support import FIXTURES, ROOT, TOKENIZER
from tests.support.configs import small_config
from tests.support.harness import error_lines, metrics, train_one

TASK = FIXTURES / "eval" / "tiny-choice.jsonl"
ENV = {"PYTHONPATH": str(ROOT)}  # the hook module of tests/support
INFO = TokenizerInfo("tokenizer", 1494, eos_id=0, path=str(TOKENIZER / "tokenizer.json"))


def test_acc_by_summed_logprob_and_acc_norm_per_character_ties_to_the_first():
    items = [TaskItem("c", (" a", " bbbbbbbb"), 1),  # sums favour 0, per character 1
             TaskItem("c", (" x", " y"), 0),  # a tie: the first choice
             TaskItem("c", (" p", " q", " r"), 2)]
    task = Task("t", "t.jsonl", items, [Request((1, 2), 1)] * 7)
    logprobs = [-2.0, -3.0, -1.0, -1.0, -5.0, -4.0, -3.0]
    assert task_metrics(task, logprobs) == {"acc": 2 / 3, "acc_norm": 3 / 3, "n": 3}


def test_rows_cut_the_context_from_the_left_and_label_only_the_choice():
    inputs, labels, mask = row_tensors(Request((5, 6, 7, 8, 9), 2), 6)
    assert (inputs, labels, mask) == ([5, 6, 7, 8, 0, 0], [6, 7, 8, 9, 0, 0], [False, False, True, True, False, False])
    inputs, labels, mask = row_tensors(Request((1, 2, 3, 4, 5, 6, 7), 2), 4)  # 7 tokens, 5 fit
    assert (inputs, labels, mask) == ([3, 4, 5, 6], [4, 5, 6, 7], [False, False, True, True])
    # dp 2 × micro-batch 2 × accumulation 2: rank 1's rows are global rows 2, 3 and 6, 7; 9 requests pad 7
    requests = [Request((i, 100 + i), 1) for i in range(9)]
    rank1 = SimpleNamespace(dp_rank=1, dp_size=2)
    steps = list(task_batches(requests, 4, rank1, micro_batch_size=2, accumulation=2))
    assert len(steps) == 2
    assert [b["input_ids"][:, 0].tolist() for b in steps[0]] == [[2, 3], [6, 7]]
    assert [b["label_ids"][:, 0].tolist() for b in steps[1]] == [[0, 0], [0, 0]]
    assert not any(b["label_mask"].any() for b in steps[1])


def test_task_files_are_read_and_encoded_as_the_harness_does(tmp_path):
    from tokenizers import Tokenizer

    cfg = load_config(small_config(tmp_path, tmp_path / "run", single_stage=True))
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    (task,) = open_tasks(cfg, INFO, [("tiny", str(TASK))])
    first = json.loads(TASK.read_text().splitlines()[0])
    context = tok.encode(first["context"], add_special_tokens=False).ids
    paris = tok.encode(" Paris", add_special_tokens=False).ids
    assert task.requests[0] == Request(tuple(context + paris), len(paris))
    assert len(task.items) == 7 and len(task.requests) == 18
    empty = task.requests[-1]  # an empty context starts with the EOS token
    assert empty.ids[0] == 0 and len(empty.ids) == 1 + empty.scored


@pytest.mark.parametrize(("text", "message"), [
    ('{"context": "a", "choices": [" b", " c"]}\n',
     'LINE 1: an item is an object with "context", "choices" and "gold"'),
    ('{"context": "a", "choices": [" b", " c"], "gold": 0}\n{"context": "a", "choices": [" b"], "gold": 0}\n',
     'LINE 2: "choices" must be a list of at least two non-empty strings'),
    ('{"context": "a", "choices": [" b", " c"], "gold": 2}\n',
     'LINE 1: "gold" is 2; it must be the index of the right choice, 0 to 1'),
    ('{"context": 3, "choices": [" b", " c"], "gold": 0}\n', 'LINE 1: "context" must be a string'),
    ("\n\n", 'FILE: the task file holds no item; write one JSON object a line'),
    ('{"context": "a", "choices": [" b", "' + " long" * 40 + '"], "gold": 0}\n',
     "LINE 1: choice 1 is 120 tokens, longer than the evaluation's sequence length 32; shorten it"),
])
def test_a_bad_task_file_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "task.jsonl"
    path.write_text(text)
    cfg = load_config(small_config(tmp_path, tmp_path / "run", single_stage=True))
    with pytest.raises(ConfigError) as e:
        open_tasks(cfg, INFO, [("t", str(path))])
    assert str(e.value) == message.replace("LINE ", f"{path}:").replace("FILE", str(path))


def test_bad_evaluation_settings_are_one_error_line_before_training(shards, tmp_path):
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, single_stage=True,
                       evaluation={"interval": 1, "tasks": [{"name": "t", "path": str(tmp_path / "none.jsonl")}]})
    proc = train_one(cfg, shards, check=False)
    assert proc.returncode == 1
    assert error_lines(proc.stderr) == [f"error: {tmp_path / 'none.jsonl'}: no such task file; give "
                                        f"evaluation.tasks[].path as a JSON-lines file of {{\"context\", \"choices\", "
                                        f"\"gold\"}} rows"]
    d = yaml.safe_load(cfg.read_text())
    d["evaluation"] = {"interval": 1, "hooks": ["no_such_module_x:run"]}
    cfg.write_text(yaml.safe_dump(d))
    proc = train_one(cfg, shards, check=False)
    assert error_lines(proc.stderr)[0].startswith("error: evaluation.hooks[0] 'no_such_module_x:run': module "
                                                  "'no_such_module_x' does not import")
    d["evaluation"] = {"interval": 1, "hooks": ["just_a_module"]}
    cfg.write_text(yaml.safe_dump(d))
    assert error_lines(train_one(cfg, shards, check=False).stderr) == [
        f"error: {cfg}: evaluation.hooks[0] is 'just_a_module'; write it as module:function (e.g. "
        f"my_evals:run_harness)"]


def reference_logprobs(hf: Path, task_file: Path) -> list[list[float]]:
    """Each choice's summed log-probability by transformers on the exported model: context and choice encoded
    separately (no special tokens) and concatenated, an empty context replaced by the EOS token."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(hf)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    out = []
    for line in task_file.read_text().splitlines():
        item = json.loads(line)
        context = tok(item["context"], add_special_tokens=False).input_ids or [tok.eos_token_id]
        scores = []
        for choice in item["choices"]:
            cont = tok(choice, add_special_tokens=False).input_ids
            ids = torch.tensor([context + cont])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            positions = range(len(context) - 1, len(context) + len(cont) - 1)
            scores.append(float(sum(logp[p, t] for p, t in zip(positions, cont))))
        out.append(scores)
    return out


def harness_metrics(task_file: Path, logprobs: list[list[float]]) -> dict:
    items = [json.loads(line) for line in task_file.read_text().splitlines()]
    acc = sum(max(range(len(s)), key=lambda i: (s[i], -i)) == it["gold"] for it, s in zip(items, logprobs))
    norm = sum(max(range(len(s)), key=lambda i: (s[i] / len(it["choices"][i]), -i)) == it["gold"]
               for it, s in zip(items, logprobs))
    return {"acc": acc / len(items), "acc_norm": norm / len(items), "n": len(items)}


def test_evaluation_during_training_equals_transformers_on_the_exported_model(shards, tmp_path):
    """Three steps, evaluation every 3rd: the row of step 3 equals the harness's rule applied with transformers to
    the exported model; the hook is called with the engine and the step; ``nanoset evaluate --task`` on the final
    checkpoint gives the same row, also in a pp 2 layout."""
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=3, single_stage=True, interval=10,
                       checkpoints={"checkpoint_interval": 10, "export_hf": True},
                       evaluation={"interval": 3, "tasks": [{"name": "tiny", "path": str(TASK)}],
                                   "hooks": ["tests.support.evaluation_hooks:parameters_and_step"]})
    proc = train_one(cfg, shards, env=ENV)
    (row,) = [r for r in metrics(tmp_path / "run") if "eval" in r]
    theirs = harness_metrics(TASK, reference_logprobs(tmp_path / "run" / "hf", TASK))
    assert row["step"] == 3 and row["eval"]["tiny"] == theirs
    assert row["eval"]["hook"] == {"step": 3, "tensors": 2 * 9 + 3}  # 2 layers of 9 tensors, embeddings, norm, head
    assert f"eval      3 | pretrain | tiny: acc {theirs['acc']:.4f} acc_norm {theirs['acc_norm']:.4f} (n 7)" in \
        proc.stdout
    checkpoint = tmp_path / "run" / "checkpoints"
    for nproc, sets in ((1, []), (2, ["--set", "parallelism.dp=1", "--set", "parallelism.pp=2", "--set",
                                  "tokens.batch_accumulation_per_replica=2"])):
        launch = ["-m", "runtime.evaluate"] if nproc == 1 else [
            "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "runtime.evaluate"]
        out = subprocess.run([sys.executable, *launch, "--config", str(cfg), "--checkpoint", str(checkpoint),
                              "--task", str(TASK), "--json", *sets], capture_output=True, text=True, cwd=shards,
                             timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.splitlines()[-1]) == {"step": 3, "stage": "pretrain",
                                                          "eval": {"tiny-choice": theirs}}
