"""Config loading and every validation rule, each with the message that says what to change."""

from __future__ import annotations

import copy

import pytest
import yaml

from runtime.compat import get_config_from_yaml
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.data.hf_datasets import resolve_stage_folders
from runtime.data.order.plan import DataPlan
from tests.support import CONFIGS, TOKENIZER

BASE = yaml.safe_load((CONFIGS / "two-stage.yaml").read_text())


def load(tmp_path, edit=None, data=None):
    d = copy.deepcopy(BASE if data is None else data)
    if edit:
        edit(d)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(d))
    return load_config(path)


def fails(tmp_path, edit, *fragments):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, edit)
    for f in fragments:
        assert f in str(e.value), str(e.value)


def test_example_loads_and_validates(shards, monkeypatch):
    monkeypatch.chdir(shards)
    c = get_config_from_yaml(CONFIGS / "two-stage.yaml")
    assert c.global_batch_size == 8 and c.parallelism.dp == 2 and c.model.kv_heads == 2
    assert [s.name for s in c.data_stages] == ["pretrain", "anneal"]
    assert c.data_stages[0].data.dataset.weights == [0.7, 0.3] and c.data_stages[1].data.dataset.weights == [1.0]
    assert c.stage_sequence_length(c.data_stages[1]) == 64 and c.stage_seed(c.data_stages[1]) == 42
    plan = DataPlan(c)
    assert [(s.start_step, s.end_step) for s in plan.stages] == [(1, 31), (31, 41)]


def test_unknown_key_names_path_and_closest(tmp_path):
    fails(tmp_path, lambda d: d["tokens"].update(micro_batch_sise=2), "tokens.micro_batch_sise: unknown key",
          "did you mean 'micro_batch_size'")
    fails(tmp_path, lambda d: d["data_stages"][0]["data"].update(shufle=True), "data_stages[0].data.shufle")
    fails(tmp_path, lambda d: d["model"].pop("hidden_size"), "model.hidden_size: required key is missing")
    fails(tmp_path, lambda d: d["tokens"].update(train_steps="many"), "tokens.train_steps: expected an integer")
    fails(tmp_path, lambda d: d["parallelism"].update(pp_engine="zb"), "'zb' is not one of")
    # inside a union-typed entry (Nanoset folders | Hugging Face dataset): the kind the keys fit best
    fails(tmp_path, lambda d: stage(d, 1)["data"].update(dataset={"dataset_folders": ["shards/sft"]}),
          "data_stages[1].data.dataset.dataset_folders: unknown key; did you mean 'dataset_folder'?")
    fails(tmp_path, lambda d: stage(d, 1)["data"].update(dataset={"hf_dataset_or_dataset": "x"}),
          "data_stages[1].data.dataset.hf_dataset_or_dataset: unknown key; did you mean "
          "'hf_dataset_or_datasets'?")
    fails(tmp_path, lambda d: stage(d, 1)["data"].update(dataset={"text_column_name": "x"}),
          "data_stages[1].data.dataset.hf_dataset_or_datasets: required key is missing")
    # a key of the other kind beside a required one: reported against the kind given (was: "dataset_folder:
    # unknown key" against the Hugging Face kind, which also has one key in common: sft)
    fails(tmp_path, lambda d: stage(d, 1)["data"].update(dataset={"dataset_folder": "shards/sft", "sft": True}),
          "data_stages[1].data.dataset.sft: unknown key; valid keys: dataset_folder, dataset_weights")


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("text, message", [
    ("general: {project: a, run: b\nmodel: x\n", "bad.yaml:2:6: not valid YAML: expected ',' or '}', but got ':' "
                                                 "(while parsing a flow mapping that began at line 1, column 10)"),
    ("tokens:\n  train_steps: 4\n\tseed: 1\n", "bad.yaml:3:1: not valid YAML: found character '\\t' that cannot "
                                                "start any token"),
    ("general: x: y\n", "bad.yaml:1:11: not valid YAML: mapping values are not allowed here"),
])
def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path, text, message):
    """PyYAML's message is seven lines (an excerpt and a caret for the start and for the problem): one line,
    FILE:LINE:COLUMN (1-based) then the problem."""
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "bad.yaml")
    assert str(e.value) == f"{tmp_path}/{message}"


@pytest.mark.parametrize("text, message", [
    ("tokens: {train_steps: 40}\ntokens: {train_steps: 7}\n",
     "bad.yaml:2:1: not valid YAML: key 'tokens' given twice (first at line 1): keep one"),
    ("model:\n  hidden_size: 64\n  hidden_size: 32\n",
     "bad.yaml:3:3: not valid YAML: key 'hidden_size' given twice (first at line 2): keep one"),
])
def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path, text, message):
    """PyYAML keeps the last of two equal keys without a word: a second ``tokens:`` section would replace the
    first one's train steps silently."""
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "bad.yaml")
    assert str(e.value) == f"{tmp_path}/{message}"


def test_an_unreadable_config_file_is_one_line_naming_it(tmp_path):
    """A config that is not UTF-8 text, or a folder, is one line naming the file (not a traceback)."""
    (tmp_path / "latin.yaml").write_bytes(b"general: {project: caf\xe9}\n")
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "latin.yaml")
    assert str(e.value) == f"{tmp_path}/latin.yaml: not UTF-8 text (byte 0xe9 at offset 22); save it as UTF-8"
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "folder.yaml")
    assert str(e.value) == f"{tmp_path}/folder.yaml: cannot read the config (Is a directory); pass a YAML file"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["model"].update(hidden_size="64"), "model.hidden_size: expected an integer, got '64'"),
    (lambda d: d["model"].update(hiden_size=64), "model.hiden_size: unknown key; did you mean 'hidden_size'?"),
    (lambda d: d.pop("tokens"), "tokens: required key is missing"),
    (lambda d: d.update(toknes={}), "toknes: unknown key; did you mean 'tokens'?"),
    (lambda d: d["optimizer"].update(learning_rate=-1.0), "optimizer.learning_rate: must be > 0, got -1.0"),
])
def test_keys_are_named_one_way_in_every_message(tmp_path, edit, message):
    """Type and unknown-key errors name a key as the rules' messages and the docs do (``model.hidden_size``,
    not ``config.model.hidden_size``)."""
    with pytest.raises(ConfigError) as e:
        load(tmp_path, edit)
    assert str(e.value).startswith(f"{tmp_path / 'cfg.yaml'}: {message}"), str(e.value)


def stage(d, i):
    return d["data_stages"][i]


@pytest.mark.parametrize("edit,message", [
    (lambda d: stage(d, 1).update(name="pretrain"), "stage names must be unique"),
    (lambda d: stage(d, 1).update(start_training_step=1), "is used by several stages"),
    (lambda d: [stage(d, 0).update(start_training_step=2)], "one stage must start at step 1"),
    (lambda d: d["data_stages"].reverse(), "listed in order of start_training_step"),
    (lambda d: stage(d, 1).update(start_training_step=41), "outside [1, tokens.train_steps=40]"),
    (lambda d: stage(d, 0)["data"]["dataset"].update(dataset_weights=[0.7, -0.3]), "weights must be positive"),
    (lambda d: stage(d, 0)["data"]["dataset"].update(dataset_weights=[1.0]), "1 weights for 2 folders"),
    (lambda d: stage(d, 0)["data"]["dataset"].update(dataset_folder=["shards/web", "./shards/code/../web"]),
     "data_stages[0] (pretrain).data.dataset.dataset_folder: 'shards/web' and './shards/code/../web' are the same "
     "folder; list it once and merge the weights"),
    (lambda d: stage(d, 1).update(sequence_length=512), "sequence_length 512 > model.max_position_embeddings 256"),
    (lambda d: d["tokens"].update(sequence_length=300), "tokens.sequence_length 300 > model.max_position_embeddings"),
    (lambda d: d["parallelism"].update(tp=3), "parallelism.tp 3 must divide model.num_attention_heads 4"),
    (lambda d: d["parallelism"].update(pp=8), "model.num_hidden_layers 4 < 8 pipeline stages"),
    (lambda d: (d["parallelism"].update(tp=2), d["model"].update(compile=True)),
     "model.compile with parallelism.tp 2 fails in torch's DTensor backward under torch.compile"),
    (lambda d: d["parallelism"].update(pp=2, pp_engine="interleaved-1f1b", pp_virtual_stages=4),
     "< 8 pipeline stages (parallelism.pp 2 × pp_virtual_stages 4)"),
    (lambda d: d["parallelism"].update(pp=4, pp_engine="1f1b"), "batch_accumulation_per_replica 2 < parallelism.pp 4"),
    (lambda d: d["model"].update(num_key_value_heads=3), "not divisible by num_key_value_heads 3"),
    (lambda d: d["model"].update(hidden_size=66), "hidden_size 66 is not divisible by num_attention_heads"),
    (lambda d: d["tokens"].update(micro_batch_size=0), "tokens.micro_batch_size: must be > 0"),
    (lambda d: d["lr_scheduler"].update(min_lr=1.0), "min_lr 1.0 > optimizer.learning_rate"),
    (lambda d: stage(d, 1)["data"].update(dataset={"hf_dataset_or_datasets": "x"}), "needs a top-level tokenizer"),
    (lambda d: d.update(data_stages=[]), "at least one stage"),
])
def test_validation_rules(tmp_path, edit, message):
    fails(tmp_path, edit, message)


@pytest.mark.parametrize("model, message", [
    # was "; give model.head_dim": heads of another size than hidden / heads, rarely what was meant
    ({"hidden_size": 96, "num_attention_heads": 5, "num_key_value_heads": None},
     "model.hidden_size 96 is not divisible by num_attention_heads 5; use 4 or 6 heads (head size 24 or 16)"),
    ({"hidden_size": 96, "num_attention_heads": 7, "num_key_value_heads": 2},  # multiples of the 2 kv heads only
     "model.hidden_size 96 is not divisible by num_attention_heads 7; use 6 or 8 heads (head size 16 or 12)"),
    ({"hidden_size": 90, "num_attention_heads": 6, "num_key_value_heads": None},
     "model: head size 15 (hidden_size 90 / num_attention_heads 6) must be even for RoPE; use 5 or 9 heads (head "
     "size 18 or 10)"),
    ({"hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": 2},
     "model.num_attention_heads 3 is not divisible by num_key_value_heads 2; give num_key_value_heads a divisor of "
     "it (1, 3)"),
    ({"hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": None, "head_dim": 33},
     "model.head_dim 33 must be even for RoPE (each rotation turns a pair of dimensions); use 32 or 34"),
])
def test_a_model_shape_that_does_not_split_names_the_head_counts_that_do(tmp_path, model, message):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, lambda d: d["model"].update(model))
    assert str(e.value) == f"{tmp_path / 'cfg.yaml'}: {message}"


@pytest.mark.parametrize("section, key, value, line", [
    ("lr_scheduler", "min_lr", -1e-4, "lr_scheduler.min_lr: must be ≥ 0, got -0.0001"),  # gradient ascent
    ("optimizer", "clip_grad", -1.0, "optimizer.clip_grad: must be > 0, got -1.0"),  # silently no clipping
    ("optimizer", "adam_beta1", 1.0, "optimizer.adam_beta1: must be in [0, 1), got 1.0"),
    ("optimizer", "adam_beta2", -0.5, "optimizer.adam_beta2: must be in [0, 1), got -0.5"),
    ("optimizer", "adam_eps", -1e-8, "optimizer.adam_eps: must be ≥ 0, got -1e-08"),
    ("optimizer", "learning_rate", float("nan"), "optimizer.learning_rate: must be > 0, got nan"),
    ("optimizer", "max_skipped_steps", -1, "optimizer.max_skipped_steps: must be ≥ 0, got -1"),
    ("model", "init_std", -0.02, "model.init_std: must be ≥ 0, got -0.02"),
    ("model", "rms_norm_eps", 0.0, "model.rms_norm_eps: must be > 0, got 0.0"),  # trained NaN
    ("model", "rope_theta", float("inf"), "model.rope_theta: must be > 0, got inf"),
    ("general", "seed", -3, "general.seed: must be in [0, 18446744073709551615], got -3"),
    # torch.manual_seed's limit: passed the check, then an overflow traceback on every rank
    ("general", "seed", 2**64, "general.seed: must be in [0, 18446744073709551615], got 18446744073709551616"),
    ("lr_scheduler", "wsd_decay_fraction", 0.0, "lr_scheduler.wsd_decay_fraction: must be in (0, 1], got 0.0"),
    ("lr_scheduler", "warmup_steps", 41, "lr_scheduler.warmup_steps 41 > tokens.train_steps 40: the learning rate "
                                         "would never reach its peak; lower warmup_steps"),
])
def test_out_of_range_values_are_one_line_naming_the_key(tmp_path, section, key, value, line):
    """Each was accepted (and trained wrongly) or a traceback on every rank after start-up."""
    with pytest.raises(ConfigError) as e:
        load(tmp_path, lambda d: d[section].update({key: value}))
    assert str(e.value) == f"{tmp_path / 'cfg.yaml'}: {line}"


def test_a_stage_keys_range_names_the_stage(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, lambda d: stage(d, 1)["data"].update(seed=-1))
    assert str(e.value).endswith(": data_stages[1] (anneal).data.seed: must be in [0, 18446744073709551615], got -1")
    with pytest.raises(ConfigError) as e:
        load(tmp_path, lambda d: stage(d, 0)["data"].update(seed=2**64))
    assert str(e.value).endswith(": data_stages[0] (pretrain).data.seed: must be in [0, 18446744073709551615], got "
                                 "18446744073709551616")


def test_zero_train_steps_load_save_and_export(tmp_path):
    """0 steps: a run that only loads (a Hugging Face model) and saves; the first stage still starts at step 1."""
    c = load(tmp_path, lambda d: (d["tokens"].update(train_steps=0), d["lr_scheduler"].update(warmup_steps=0),
                                  d["data_stages"].pop(1)))
    assert c.tokens.train_steps == 0 and c.data_stages[0].start_training_step == 1
    fails(tmp_path, lambda d: (d["tokens"].update(train_steps=0), d["lr_scheduler"].update(warmup_steps=0)),
          "data_stages[1] (anneal).start_training_step: 31 is outside [1, tokens.train_steps=0]")


def data_fails(tmp_path, shards, monkeypatch, edit, *fragments):
    monkeypatch.chdir(shards)
    c = load(tmp_path, edit)
    with pytest.raises(ConfigError) as e:
        DataPlan(c)
    for f in fragments:
        assert f in str(e.value), str(e.value)


def test_missing_folder(tmp_path, shards, monkeypatch):
    data_fails(tmp_path, shards, monkeypatch,
               lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder="shards/nope"),
               "data_stages[1] (anneal).data.dataset.dataset_folder", "shards/nope: no such dataset folder")


def test_a_missing_relative_folder_is_said_with_the_working_directory_it_was_read_from(tmp_path, shards,
                                                                                        monkeypatch):
    """Relative paths are read from the working directory (as Nanotron reads them), not from the config's
    folder: the message says which directory that was; an absolute path needs none."""
    monkeypatch.chdir(shards)
    c = load(tmp_path, lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder="shards/dict"))
    with pytest.raises(ConfigError) as e:
        DataPlan(c)
    assert str(e.value) == (
        f"data_stages[1] (anneal).data.dataset.dataset_folder: shards/dict: no such dataset folder in the working "
        f"directory {shards} (a relative path is read from there: run from the folder that holds it, give its "
        f"absolute path, or create it with `nanoset tokenize ... -o shards/dict`)")
    c = load(tmp_path, lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder=str(shards / "dict")))
    with pytest.raises(ConfigError) as e:
        DataPlan(c)
    assert str(e.value).endswith(f": {shards / 'dict'}: no such dataset folder (create it with `nanoset tokenize ... "
                                 f"-o {shards / 'dict'}`)")
    hf = load(tmp_path, lambda d: (stage(d, 1)["data"].update(dataset={"hf_dataset_or_datasets": "qa"}),
                                   d.update(tokenizer={"tokenizer_name_or_path": str(TOKENIZER)})))
    with pytest.raises(ConfigError) as e:
        DataPlan(hf, resolve_stage_folders(hf))
    assert f"'qa': no such local file or folder in the working directory {shards} (" in str(e.value)


def test_not_a_dataset_folder(tmp_path, shards, monkeypatch):
    (shards / "empty").mkdir(exist_ok=True)
    data_fails(tmp_path, shards, monkeypatch, lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder="empty"),
               "neither nanoset.json nor *.ds shards found")


def test_vocab_too_small(tmp_path, shards, monkeypatch):
    data_fails(tmp_path, shards, monkeypatch, lambda d: d["model"].update(vocab_size=1000),
               "model.vocab_size 1000 < vocab size 1494", "raise model.vocab_size to at least 1494")


def test_one_tokenizer_for_all(tmp_path, shards, monkeypatch):
    import json
    import shutil

    other = shards / "other_tok"
    if not other.exists():
        shutil.copytree(shards / "shards" / "sft", other)
        manifest = json.loads((other / "nanoset.json").read_text())
        manifest["tokenizer"]["sha256"] = "f" * 64
        (other / "nanoset.json").write_text(json.dumps(manifest))
    data_fails(tmp_path, shards, monkeypatch,
               lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder="other_tok"),
               "different tokenizers", "re-tokenize them with one tokenizer")


def test_too_few_tokens_for_a_window(tmp_path, shards, monkeypatch):
    from nanoset import Manifest, ShardWriter, write_manifest
    tiny = shards / "tiny"
    if not tiny.exists():
        with ShardWriter(tiny, "s", "uint16", "t") as w:
            w.add_document([1, 2, 0])
            info = w.finalize()
        src = (shards / "shards" / "sft" / "nanoset.json")
        tok = Manifest.load(src.parent).tokenizer
        write_manifest(tiny, Manifest(tok, "uint16", [info]))
    data_fails(tmp_path, shards, monkeypatch, lambda d: stage(d, 1)["data"]["dataset"].update(dataset_folder="tiny"),
               "tiny has 3 tokens, too few for one window of 65")


# The seed documents' config lines as written there (seeds/000: the custom-loader document; seeds/001: the
# multi-stage one), and our module names for theirs: the rest of each line runs as it is.
SEED_SNIPPETS = {
    "path/to/your/config.yaml": ("from nanotron.config import Config\n\n"
                                 'cfg = Config.from_yaml("path/to/your/config.yaml")\n'),
    "multistage_config.yaml": ("from nanotron.config.config import Config, get_config_from_yaml\n\n"
                               'cfg: Config = get_config_from_yaml("multistage_config.yaml")\n'),
}
OUR_MODULES = {"nanotron.config.config": "runtime.config", "nanotron.config": "runtime.config"}


@pytest.mark.parametrize("path", sorted(SEED_SNIPPETS))
def test_the_seed_documents_config_lines_run_with_our_module_names(tmp_path, path):
    """Each snippet in a fresh interpreter (so no earlier import hides a cycle): the Config it loads is
    load_config's, and loading the config imported neither torch nor the trainer."""
    import json
    import subprocess
    import sys

    snippet = SEED_SNIPPETS[path]
    for theirs, ours in OUR_MODULES.items():
        snippet = snippet.replace(f"from {theirs} import", f"from {ours} import")
    assert "nanotron" not in snippet
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text((CONFIGS / "two-stage.yaml").read_text())
    check = "import json, sys\nprint(json.dumps([cfg.to_dict(), 'torch' in sys.modules]))\n"
    proc = subprocess.run([sys.executable, "-c", snippet + check], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loaded, torch_imported = json.loads(proc.stdout)
    assert loaded == load_config(CONFIGS / "two-stage.yaml").to_dict() and not torch_imported
