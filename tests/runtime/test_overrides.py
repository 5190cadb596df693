"""``--set KEY=VALUE``: the config the file would give with that value, for nanoset train (launcher and workers),
explain and evaluate; each mistake one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from runtime.config import ConfigError
from runtime.config.load import load_config, read_config
from tests.support import CONFIGS
from tests.support.configs import small_config
from tests.support.harness import metrics

BASE = CONFIGS / "two-stage.yaml"


def file_with(tmp_path, edit) -> str:
    """The fixture config with ``edit`` made in the file itself."""
    data = yaml.safe_load(BASE.read_text())
    edit(data)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_each_kind_of_key_and_value_gives_the_config_of_the_file_that_says_it(tmp_path):
    """Dotted keys, list indices, YAML numbers (3e-4 too), lists, mappings (a weight schedule), a section the file
    leaves out (lr_scheduler.decay_style is given, validation is not), in order: the same Config as the file."""
    sets = ["tokens.train_steps=80", "optimizer.learning_rate=3e-4", "data_stages[1].data.seed=7",
            "data_stages[0].data.dataset.dataset_weights=[{step: 1, weights: [1, 1]}, {step: 20, weights: [1, 3]}]",
            "validation.datasets={web: shards/web}", "validation.samples=8", "data_stages[1].sequence_length=32",
            "tokens.train_steps=60"]  # a later --set wins

    def edit(d):
        d["tokens"]["train_steps"] = 60
        d["optimizer"]["learning_rate"] = 0.0003
        d["data_stages"][1]["data"]["seed"] = 7
        d["data_stages"][0]["data"]["dataset"]["dataset_weights"] = [{"step": 1, "weights": [1, 1]},
                                                                    {"step": 20, "weights": [1, 3]}]
        d["validation"] = {"datasets": {"web": "shards/web"}, "samples": 8}
        d["data_stages"][1]["sequence_length"] = 32

    config, changes = read_config(BASE, sets)
    assert config.to_dict() == load_config(file_with(tmp_path, edit)).to_dict()
    assert changes[:3] == ["tokens.train_steps: 40 → 80", "optimizer.learning_rate: 0.003 → 0.0003",
                           "data_stages[1].data.seed: null → 7"]
    assert changes[5:] == ["validation.samples: 64 → 8", "data_stages[1].sequence_length: 64 → 32",
                           "tokens.train_steps: 80 → 60"]


def test_a_number_in_exponent_form_is_a_number_in_the_file_too(tmp_path):
    """PyYAML reads 3e-4 as a string ('expected a number'); the file and --set read it as YAML 1.2 does."""
    config = load_config(file_with(tmp_path, lambda d: d["optimizer"].update(learning_rate="3e-4")))
    assert config.optimizer.learning_rate == 0.0003
    assert (tmp_path / "edited.yaml").read_text().count("learning_rate: 3e-4") == 1  # written as the string's text


@pytest.mark.parametrize("given, message", [
    ("tokens.train_step=80", "--set tokens.train_step=80: tokens.train_step: unknown key; did you mean "
                             "tokens.train_steps?"),
    ("optimiser.learning_rate=1", "--set optimiser.learning_rate=1: optimiser: unknown key; did you mean optimizer?"),
    ("data_stages[1].data.sed=3", "--set data_stages[1].data.sed=3: data_stages[1].data.sed: unknown key; did you "
                                  "mean data_stages[1].data.seed?"),
    ("data_stages[2].data.seed=3", "--set data_stages[2].data.seed=3: data_stages[2] is not in the config (2 "
                                   "entries: data_stages[0] to data_stages[1]); --set changes entries, it does not "
                                   "add them"),
    ("tokens.train_steps.x=1", "--set tokens.train_steps.x=1: tokens.train_steps is a value, not a section with keys"),
    ("tokens[0]=1", "--set tokens[0]=1: tokens is not a list"),
    ("train_steps", "--set train_steps: expected KEY=VALUE with a dotted key, e.g. --set tokens.train_steps=80 or "
                    "--set data_stages[1].data.seed=7"),
    ("general.run=[a", "--set general.run=[a: the value is not valid YAML (expected ',' or ']', but got '<stream "
                       "end>')"),
    ("tokens.train_steps=many", f"{BASE} with --set tokens.train_steps=many: tokens.train_steps: expected an "
                                f"integer, got 'many'"),  # checked as the file's value is
    ("optimizer.learning_rate=-1", f"{BASE} with --set optimizer.learning_rate=-1: optimizer.learning_rate: must be "
                                   f"> 0, got -1.0"),
])
def test_a_mistake_in_a_set_is_one_line(given, message):
    with pytest.raises(ConfigError) as e:
        load_config(BASE, [given])
    assert str(e.value) == message


def test_nanoset_train_passes_its_sets_to_the_workers_as_the_file_would(shards, tmp_path):
    """nanoset train --set (one process) trains what a file holding the same values trains: the same data_hash
    and losses at every step, the checkpoint's config records the values; --check shows them, explain and
    evaluate take the same --set (same data_hash, same validation loss)."""
    base = small_config(tmp_path, tmp_path / "by-set", dp=1, steps=4, single_stage=True, name="base.yaml")
    sets = ["tokens.train_steps=3", "optimizer.learning_rate=3e-3", "data_stages[0].data.seed=7",
            "data_stages[0].data.dataset.dataset_weights=[0.5, 0.5]"]
    data = yaml.safe_load(base.read_text())
    data["general"]["run_dir"] = str(tmp_path / "by-file")
    data["tokens"]["train_steps"] = 3
    data["optimizer"]["learning_rate"] = 0.003
    data["data_stages"][0]["data"].update(seed=7, dataset={**data["data_stages"][0]["data"]["dataset"],
                                                           "dataset_weights": [0.5, 0.5]})
    by_file = tmp_path / "file.yaml"
    by_file.write_text(yaml.safe_dump(data))
    set_args = [word for s in sets for word in ("--set", s)]

    def cli(*args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=shards, timeout=600)

    check = cli("-m", "nanoset.cli", "train", "--config", str(base), "--check", *set_args)
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines()[:5] == [
        "--set tokens.train_steps: 4 → 3", "--set optimizer.learning_rate: 0.003 → 0.003",
        "--set data_stages[0].data.seed: 42 → 7",
        "--set data_stages[0].data.dataset.dataset_weights: [0.7, 0.3] → [0.5, 0.5]",
        "start: starts fresh at step 1 of 3"]
    for args in (("-m", "nanoset.cli", "train", "--config", str(base), *set_args),
                 ("-m", "nanoset.cli", "train", "--config", str(by_file))):
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ours, theirs = metrics(tmp_path / "by-set"), metrics(tmp_path / "by-file")
    assert [(r["step"], r["data_hash"], r["loss"]) for r in ours] == [
        (r["step"], r["data_hash"], r["loss"]) for r in theirs] and len(ours) == 3
    recorded = json.loads((tmp_path / "by-set" / "checkpoints" / "step-000003" / "metadata.json").read_text())
    assert recorded["config"]["data_stages"][0]["data"]["seed"] == 7
    assert recorded["config"]["tokens"]["train_steps"] == 3
    explained = cli("-m", "runtime.explain", "--config", str(base), "--step", "2", "--json", *set_args)
    assert json.loads(explained.stdout)[0]["data_hash"] == ours[1]["data_hash"]
    validation = ["--set", "validation.datasets={web: shards/web}", "--set", "validation.samples=4"]
    evaluated = cli("-m", "runtime.evaluate", "--config", str(base), "--checkpoint",
                    str(tmp_path / "by-set" / "checkpoints"), "--json", *set_args, *validation)
    data["validation"] = {"datasets": {"web": "shards/web"}, "samples": 4}
    by_file.write_text(yaml.safe_dump(data))
    reference = cli("-m", "runtime.evaluate", "--config", str(by_file), "--checkpoint",
                    str(tmp_path / "by-set" / "checkpoints"), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout) == json.loads(reference.stdout)
    bad = cli("-m", "nanoset.cli", "train", "--config", str(base), "--set", "tokens.train_step=3")
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        1, "", "error: --set tokens.train_step=3: tokens.train_step: unknown key; did you mean tokens.train_steps?\n")
