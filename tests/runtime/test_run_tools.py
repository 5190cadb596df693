"""The tools around a run as ``nanoset`` subcommands: ``metrics`` (summary, --json, --plot, --compare),
``explain``/``evaluate``/``export`` equal to their ``python -m`` forms, ``explain --decode``, ``evaluate --dataset``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer

from nanoset import open_dataset
from tests.support import TOKENIZER, run_cli
from tests.support.configs import small_config
from tests.support.harness import metrics, train_one

STEPS, BOUNDARY = 6, 4


@pytest.fixture(scope="module")
def run(shards, tmp_path_factory):
    """One process, two stages (web+code, then sft from step 4), validation on web at each stage end."""
    folder = tmp_path_factory.mktemp("tools")
    cfg = small_config(folder, folder / "run", dp=1, steps=STEPS, boundary=BOUNDARY, interval=3,
                       validation={"datasets": {"web": "shards/web"}, "samples": 4})
    train_one(cfg, shards)
    return cfg, folder / "run"


def python_m(module: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_metrics_numbers_equal_metrics_jsonl(run, shards):
    cfg, run_dir = run
    rows = metrics(run_dir)
    train = [r for r in rows if "val" not in r]
    val = [r for r in rows if "val" in r]
    summary = json.loads(run_cli("metrics", run_dir, "--json", cwd=shards).stdout)
    assert [s["name"] for s in summary["stages"]] == ["pretrain", "anneal"]
    assert summary["steps"] == STEPS and summary["last_step"] == STEPS and summary["skipped_steps"] == []
    for stage in summary["stages"]:
        mine = [r for r in train if r["stage"] == stage["name"]]
        losses = [r["loss"] for r in mine]
        assert (stage["first_step"], stage["last_step"], stage["steps"]) == (mine[0]["step"], mine[-1]["step"],
                                                                             len(mine))
        assert stage["tokens"] == sum(r["tokens"] for r in mine)
        assert stage["time_s"] == sum(r["tokens"] / r["tokens_per_s"] for r in mine)
        assert stage["label_tokens"] == sum(r["label_tokens"] for r in mine)
        assert stage["loss"] == {"first": losses[0], "last": losses[-1], "min": min(losses),
                                 "min_step": mine[losses.index(min(losses))]["step"]}
        samples = sum(s["samples"] for r in mine for s in r["sources"].values())
        for folder, s in stage["sources"].items():
            assert s["last_loss"] == mine[-1]["sources"][folder]["loss"]
            assert s["share"] == sum(r["sources"][folder]["samples"] for r in mine) / samples
        (last_val,) = [r for r in val if r["stage"] == stage["name"]]
        assert stage["validation"] == {"step": last_val["step"], "loss": {"web": last_val["val"]["web"]["loss"]}}
    # pretrain: 3 steps of seq 32, anneal: 3 steps of seq 16, 2 samples a step
    assert [s["tokens"] for s in summary["stages"]] == [3 * 2 * 32, 3 * 2 * 16]
    assert set(summary["stages"][0]["sources"]) == {"web", "code"}  # named by the folders' last component
    text = run_cli("metrics", run_dir, cwd=shards).stdout
    first = summary["stages"][0]["loss"]
    assert (f"  loss first {first['first']:.4f}, last {first['last']:.4f}, min {first['min']:.4f} "
            f"(step {first['min_step']}); skipped steps: none") in text.splitlines()
    assert text.splitlines()[0].startswith(f"{run_dir}: {STEPS} steps (1-{STEPS}), 2 stages, 288 tokens in ")


def test_metrics_plot_and_compare(run, shards, tmp_path):
    """A branch that parts at step 4 (a rewind's), with per-source weights in its rows: both drawn, the parting
    step named."""
    _, run_dir = run
    branch = tmp_path / "branch"
    branch.mkdir()
    rows = metrics(run_dir)
    for r in rows:
        if "val" not in r:
            r["weights"] = {"shards/web": 0.7, "shards/code": 0.3}
            if r["step"] >= 4:
                r["loss"] += 0.5
    (branch / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 7, "lo')  # torn
    out = tmp_path / "curves.png"
    proc = run_cli("metrics", run_dir, "--compare", branch, "--plot", out, "--json", cwd=shards)
    both = json.loads(proc.stdout)
    assert both["difference"] == {"common_steps": STEPS, "first_common_step": 1, "last_common_step": STEPS,
                                  "first_different_step": 4}
    assert both["runs"][1]["stages"][1]["loss"]["first"] == both["runs"][0]["stages"][1]["loss"]["first"] + 0.5
    first_stage = both["runs"][0]["stages"][0]["name"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    drawn = [r for r in rows if r.get("stage") == first_stage and "weights" in r]  # the trainer logs each step's
    assert both["runs"][0]["stages"][0]["weights"] == {"step": drawn[-1]["step"], "weights": drawn[-1]["weights"]}
    assert both["runs"][1]["stages"][0]["weights"] == {"step": 3, "weights": {"shards/web": 0.7, "shards/code": 0.3}}
    assert proc.stderr == f"plot written to {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    text = run_cli("metrics", run_dir, "--compare", branch, cwd=shards).stdout
    assert "  weights at step 3: shards/web 0.7, shards/code 0.3" in text.splitlines()
    assert text.splitlines()[-1] == (f"{run_dir} and {branch}: {STEPS} steps in common (1-{STEPS}); the losses "
                                     f"first differ at step 4")


def test_metrics_mistakes_are_one_line(run, shards, tmp_path):
    _, run_dir = run
    code = "import sys\nsys.modules['matplotlib'] = None\nfrom nanoset.cli import main\nmain()\n"
    proc = subprocess.run([sys.executable, "-c", code, "metrics", str(run_dir), "--plot", str(tmp_path / "p.png")],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("error: --plot needs matplotlib, which is not installed: pip install -e '.[plot]' in the "
                           "checkout (or pip install matplotlib)\n")
    proc = run_cli("metrics", tmp_path, check=False)
    assert (proc.returncode, proc.stderr) == (1, f"error: {tmp_path}/metrics.jsonl: no such file; pass a run folder "
                                                 f"(general.run_dir of the config) that has trained at least one "
                                                 f"step\n")
    proc = run_cli("metrics", run_dir, "--plot", tmp_path / "p.svg", check=False)
    assert proc.stderr == f"error: --plot {tmp_path / 'p.svg'}: the plot is a PNG; name a FILE.png\n"


def test_metrics_counts_the_trained_steps_beside_steps_surgery_skipped(tmp_path):
    """A step surgery skips logs no tokens (it trains none): the stage's tokens and time are the trained steps'."""
    from runtime.observe.metrics_summary import summarize

    trained = {"stage": "s", "lr": 1e-3, "skipped": False, "tokens": 64, "label_tokens": 60, "tokens_per_s": 32.0}
    rows = [{"step": 1, "loss": 3.0, **trained},
            {"step": 2, "stage": "s", "loss": None, "lr": 1e-3, "grad_norm": None, "skipped": "surgery"},
            {"step": 3, "loss": 2.5, **trained}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(tmp_path)
    stage = summary["stages"][0]
    assert (stage["steps"], stage["tokens"], stage["label_tokens"], stage["time_s"], stage["tokens_per_s"]) == (
        3, 128, 120, 4.0, 32.0)
    assert (summary["tokens"], summary["time_s"], summary["skipped_steps"]) == (128, 4.0, [2])
    assert stage["loss"] == {"first": 3.0, "last": 2.5, "min": 2.5, "min_step": 3}


@pytest.mark.parametrize("args", [["--step", "2"], ["--steps", "1:6", "--set", "data_stages[0].data.seed=7"],
                                  ["--document", "DOC"]])
def test_explain_subcommand_equals_python_m(run, shards, args):
    cfg, _ = run
    if "DOC" in args:  # a document step 5 trained on
        step = json.loads(run_cli("explain", "--config", cfg, "--step", "5", "--json", cwd=shards).stdout)
        args = ["--document", f"shards/sft:{step[0]['documents'][0]}"]
    ours = run_cli("explain", "--config", cfg, "--json", *args, cwd=shards)
    theirs = python_m("runtime.explain", "--config", cfg, "--json", *args, cwd=shards)
    assert theirs.returncode == 0, theirs.stderr
    assert ours.stdout == theirs.stdout and json.loads(ours.stdout)
    text = run_cli("explain", "--config", cfg, *args, cwd=shards)
    assert text.stdout == python_m("runtime.explain", "--config", cfg, *args, cwd=shards).stdout


def test_explain_set_equals_the_value_in_the_file(run, shards, tmp_path):
    cfg, _ = run
    data = yaml.safe_load(cfg.read_text())
    data["data_stages"][0]["data"]["seed"] = 7
    edited = tmp_path / "seed7.yaml"
    edited.write_text(yaml.safe_dump(data))
    by_set = json.loads(run_cli("explain", "--config", cfg, "--step", "1", "--json", "--set",
                                "data_stages[0].data.seed=7", cwd=shards).stdout)
    assert by_set == json.loads(run_cli("explain", "--config", edited, "--step", "1", "--json", cwd=shards).stdout)
    default = json.loads(run_cli("explain", "--config", cfg, "--step", "1", "--json", cwd=shards).stdout)
    assert by_set[0]["data_hash"] != default[0]["data_hash"]


def test_explain_decode_is_the_tokenizers_decode_of_the_window(run, shards):
    cfg, _ = run
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    rows = json.loads(run_cli("explain", "--config", cfg, "--steps", "3:4", "--decode", "--json", cwd=shards).stdout)
    assert [r["stage"] for r in rows] == ["pretrain"] * 2 + ["anneal"] * 2  # both sequence lengths
    for r in rows:
        ids = open_dataset(shards / r["dataset"]).tokens(*r["tokens"]).tolist()
        assert len(ids) == (33 if r["stage"] == "pretrain" else 17)  # L + 1 tokens a window
        assert r["text"] == tok.decode(ids, skip_special_tokens=False)
    cut = json.loads(run_cli("explain", "--config", cfg, "--steps", "3:4", "--decode", "--max-chars", "20", "--json",
                             cwd=shards).stdout)
    assert [c["text"] for c in cut] == [r["text"] if len(r["text"]) <= 20 else r["text"][:20] + "…" for r in rows]
    text = run_cli("explain", "--config", cfg, "--step", "4", "--decode", cwd=shards).stdout
    decoded = [line[len("         | "):] for line in text.splitlines() if line.startswith("         | ")]
    assert decoded == [line for r in rows if r["step"] == 4 for line in r["text"].split("\n")]


def test_explain_decode_mistakes_are_one_line(run, shards):
    cfg, _ = run
    proc = run_cli("explain", "--config", cfg, "--step", "1", "--max-chars", "5", check=False, cwd=shards)
    assert (proc.returncode, proc.stderr) == (1, "error: --max-chars 5: it cuts the texts of --decode; add --decode\n")
    proc = run_cli("explain", "--config", cfg, "--document", "shards/web:3", "--decode", check=False, cwd=shards)
    assert proc.returncode == 1 and proc.stderr.startswith("error: --decode: it decodes the samples of --step")


def test_evaluate_subcommand_and_dataset_without_a_validation_section(run, shards, tmp_path):
    cfg, run_dir = run
    checkpoint = run_dir / "checkpoints"
    ours = run_cli("evaluate", "--config", cfg, "--checkpoint", checkpoint, "--json", cwd=shards)
    theirs = python_m("runtime.evaluate", "--config", cfg, "--checkpoint", checkpoint, "--json", cwd=shards)
    assert ours.stdout == theirs.stdout
    data = yaml.safe_load(cfg.read_text())
    del data["validation"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(data))
    proc = run_cli("evaluate", "--config", bare, "--checkpoint", checkpoint, check=False, cwd=shards)
    assert (proc.returncode, proc.stderr) == (1, f"error: {bare}: validation.datasets is empty; name the datasets to "
                                                 f"evaluate on there, or pass --dataset FOLDER (or --task FILE)\n")
    # the same windows as the run's validation of web (seed, folder, samples): the value it logged at the end
    row = json.loads(run_cli("evaluate", "--config", bare, "--checkpoint", checkpoint, "--dataset", "shards/web",
                             "--set", "validation.samples=4", "--json", cwd=shards).stdout)
    (logged,) = [r for r in metrics(run_dir) if "val" in r and r["step"] == STEPS]
    assert list(row["val"]) == ["shards/web"] and row["step"] == STEPS
    assert row["val"]["shards/web"]["tokens"] == logged["val"]["web"]["tokens"]
    assert abs(row["val"]["shards/web"]["loss"] - logged["val"]["web"]["loss"]) < 1e-5  # fp32 sums, as in training


def test_export_subcommand_equals_python_m(run, shards, tmp_path):
    _, run_dir = run
    ours = run_cli("export", run_dir / "checkpoints", tmp_path / "a", cwd=shards)
    theirs = python_m("runtime.export", run_dir / "checkpoints", tmp_path / "b", cwd=shards)
    assert ours.stdout == theirs.stdout.replace(str(tmp_path / "b"), str(tmp_path / "a"))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    for p in (tmp_path / "a").iterdir():
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes(), p.name
    proc = run_cli("export", run_dir / "checkpoints", tmp_path / "a", check=False, cwd=shards)
    assert (proc.returncode, proc.stderr) == (1, python_m("runtime.export", run_dir / "checkpoints", tmp_path / "a",
                                                          cwd=shards).stderr)
    assert run_cli("export", "--help").stdout.startswith("usage: nanoset export [-h]")


def test_help_lists_every_command():
    out = run_cli("--help").stdout
    commands = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert commands == ["convert", "evaluate", "explain", "export", "inspect", "metrics", "tokenize", "train",
                        "verify"]
