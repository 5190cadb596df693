"""The Hugging Face stage cache: prepared once per cache however many processes ask, keyed by what the
inputs are (not only their size), and errors that name the config keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nanoset import open_dataset
from nanoset.errors import NanosetError
from runtime.config import ConfigError
from runtime.data.hf_datasets import resolve_stage_folders
from tests.support import ROOT, TOKENIZER
from tests.support.configs import make_config

TEXTS = [f"document number {i}: the quick brown fox jumps over {i} lazy dogs." for i in range(200)]


def hf_config(tmp_path, source, column="text", splits=None):
    ds = {"hf_dataset_or_datasets": str(source), "text_column_name": column}
    if splits is not None:
        ds["hf_dataset_splits"] = splits
    c = make_config(train_steps=4, seq=32, tokenizer={"tokenizer_name_or_path": str(TOKENIZER)},
                    stages=[{"name": "sft", "start_training_step": 1, "data": {"dataset": ds}}])
    c.general.cache_dir = str(tmp_path / "cache")
    return c


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


PREPARE = '''
import sys, time
sys.path.insert(0, {root!r})
import nanoset.tokenize.job
real = nanoset.tokenize.job.tokenize
def slow(opts, **kwargs):
    print("tokenizing", flush=True)
    time.sleep(2)  # both processes are surely inside prepare at once
    return real(opts, **kwargs)
nanoset.tokenize.job.tokenize = slow
from runtime.config.load import load_config
from runtime.data.hf_datasets import resolve_stage_folders
print(resolve_stage_folders(load_config(sys.argv[1]))[0][0], flush=True)
'''


def test_two_processes_prepare_one_cache_once(tmp_path, tokenizer, eos_id):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(hf_config(tmp_path, source).to_dict()))
    script = tmp_path / "prepare.py"
    script.write_text(PREPARE.format(root=str(ROOT)))
    env = {**os.environ, "LOCAL_RANK": "0"}  # as on two nodes: each is its node's first rank
    procs = [subprocess.Popen([sys.executable, str(script), str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = [o.split() for o, _ in outs]
    assert sum(line.count("tokenizing") for line in lines) == 1  # one prepares, the other waits and reuses
    folders = {line[-1] for line in lines}
    assert len(folders) == 1
    reader = open_dataset(folders.pop())
    assert reader.num_documents == 200
    assert [reader.document(i).tolist() for i in (0, 199)] == [tokenizer.encode(TEXTS[i]).ids + [eos_id]
                                                                for i in (0, 199)]


def test_an_input_rewritten_in_place_is_tokenized_again(tmp_path, tokenizer, eos_id):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    c = hf_config(tmp_path, source)
    first = resolve_stage_folders(c)[0][0]
    st = source.stat()
    edited = ["DOCUMENT" + TEXTS[0][8:]] + TEXTS[1:]  # same size
    write_jsonl(source, edited)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime, as `cp -p`/`rsync -t` leave it
    assert source.stat().st_size == st.st_size and source.stat().st_mtime_ns == st.st_mtime_ns
    second = resolve_stage_folders(c)[0][0]
    assert second != first
    assert open_dataset(second).document(0).tolist() == tokenizer.encode(edited[0]).ids + [eos_id]
    assert resolve_stage_folders(c)[0][0] == second  # and reused while the input stays as it is


def test_hf_stage_errors_name_the_config_keys(tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(hf_config(tmp_path, source, column="body"))
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset.text_column_name: 'body' is not a column of "
                            f"{source}:1; the columns there are: text")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(hf_config(tmp_path, saved, splits=["train", "test"]))
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset.hf_dataset_splits: no split 'test' in {saved}; the "
                            f"splits there are: train, validation")
    with pytest.raises(ConfigError, match=r"hf_dataset_splits: .*docs.jsonl has no splits"):
        resolve_stage_folders(hf_config(tmp_path, source, splits="train"))
    with pytest.raises(ConfigError, match=r"^data_stages\[0\] \(sft\).data.dataset.hf_dataset_or_datasets: "):
        resolve_stage_folders(hf_config(tmp_path, tmp_path / "nope"))
    chats = tmp_path / "chats.jsonl"  # conversations in a stage without sft: true
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(hf_config(tmp_path, chats))
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset.text_column_name: 'text' is not a column of {chats}:1; "
                            f"the columns there are: messages, which hold conversations: set data_stages[0] (sft)"
                            f".data.dataset.sft: true")
    (tmp_path / "afile").write_text("")
    c = hf_config(tmp_path, source)
    c.general.cache_dir = str(tmp_path / "afile" / "cache")
    with pytest.raises(NanosetError) as e:
        resolve_stage_folders(c)
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset: {tmp_path}/afile/cache: {tmp_path}/afile is a file, "
                            f"not a folder; set general.cache_dir to a writable folder")


HOLD = '''
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
import runtime.data.hf_datasets as hf_datasets
hf_datasets.HEARTBEAT_SECONDS = 0.2
with hf_datasets._exclusive(Path(sys.argv[1]), Path("out")):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
'''


def test_the_cache_lock_waits_for_a_live_holder_however_long(tmp_path, monkeypatch):
    """Waiting for the rank that tokenizes is bounded by its silence, not by its time: a holder that
    beats its heart is waited for past the limit (a fixed hour failed the other ranks of a run whose
    dataset takes longer to tokenize); one that stopped (here: SIGSTOP) is given up on."""
    import signal
    import time

    import runtime.data.hf_datasets as hf_datasets

    monkeypatch.setattr(hf_datasets, "STALE_SECONDS", 1.0)
    script, lock = tmp_path / "hold.py", tmp_path / ".cache.lock"
    script.write_text(HOLD.format(root=str(ROOT)))

    def holder(seconds):
        proc = subprocess.Popen([sys.executable, str(script), str(lock), str(seconds)], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline() == "locked\n"
        return proc

    proc = holder(3)
    start = time.monotonic()
    with hf_datasets._exclusive(lock, tmp_path / "out"):
        assert time.monotonic() - start > 2  # waited three times the limit, then got the lock
    proc.wait(timeout=30)
    proc = holder(60)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError) as e, hf_datasets._exclusive(lock, tmp_path / "out"):
            pass
        assert str(e.value).startswith(f"{tmp_path / 'out'}: {os.uname().nodename} pid {proc.pid} holds {lock} but "
                                       f"has shown no sign of life for ")
    finally:
        proc.kill()
        proc.wait()


def test_a_cache_dir_without_file_locks_is_one_clear_error(tmp_path, monkeypatch):
    """ENOSYS (e.g. Lustre mounted without flock) is not "held by another process": no 15-minute wait."""
    import errno
    import fcntl

    import runtime.data.hf_datasets as hf_datasets

    def no_locks(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    with pytest.raises(ConfigError) as e, hf_datasets._exclusive(tmp_path / ".x.lock", tmp_path / "x"):
        pass
    assert str(e.value) == (f"general.cache_dir: {tmp_path} does not support file locks (Function not implemented), "
                            f"which keep two processes from tokenizing into one cache; set cache_dir on a filesystem "
                            f"that does (a node-local disk: each node then prepares its own copy)")


def test_a_stage_says_which_dataset_it_tokenizes_and_names_the_config_key_for_eos(tmp_path, capsys):
    """Tokenized silently at start-up (a large dataset looked hung before step 1); a tokenizer without EOS was told
    to `pass --eos-token TOKEN`, a flag a config does not have."""
    src = write_jsonl(tmp_path / "texts.jsonl", TEXTS)
    c = hf_config(tmp_path, src)
    (folder,) = resolve_stage_folders(c)[0]
    out = capsys.readouterr().out
    assert (f"data_stages[0] (sft).data.dataset: the Hugging Face dataset {src} is tokenized into {folder}, once "
            f"(other processes and later runs read it)\n") in out
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel()
    plain.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    (tmp_path / "plain").mkdir()
    plain.save(str(tmp_path / "plain" / "tokenizer.json"))
    c.tokenizer.tokenizer_name_or_path = str(tmp_path / "plain")
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(c)
    assert str(e.value) == (f"data_stages[0] (sft).data.dataset: tokenizer {tmp_path / 'plain' / 'tokenizer.json'} "
                            f"declares no EOS token; set tokenizer.eos_token: TOKEN in the config (it has no special "
                            f"tokens)")


def test_a_tokenizer_mistake_comes_before_any_tokenizing_line_and_names_the_config_key(tmp_path, capsys):
    """"is tokenized into" was printed before the job found its tokenizer unusable; a tokenizer path holding
    none said `pass a path`, a flag's advice, under the stage's key instead of tokenizer.tokenizer_name_or_path."""
    src = write_jsonl(tmp_path / "texts.jsonl", TEXTS)
    c = hf_config(tmp_path, src)
    where = "data_stages[0] (sft).data.dataset"
    c.tokenizer.tokenizer_name_or_path = str(tmp_path / "nope")
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(c)
    assert str(e.value) == (  # a path, not a hub name: no `huggingface-cli download /abs/path` to suggest
        f"tokenizer.tokenizer_name_or_path (the tokenizer of {where}): tokenizer {str(tmp_path / 'nope')!r}: no such "
        f"file or folder ({tmp_path} holds no tokenizer); set tokenizer.tokenizer_name_or_path to a tokenizer.json "
        f"(or a folder holding one)")
    c.tokenizer.tokenizer_name_or_path = "some-org/not-cached"
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(c)
    assert str(e.value).endswith(
        "); nothing is downloaded: set tokenizer.tokenizer_name_or_path to a tokenizer.json (or a folder holding "
        "one), or fetch it first with `huggingface-cli download some-org/not-cached tokenizer.json`")
    (tmp_path / "empty").mkdir()
    c.tokenizer.tokenizer_name_or_path = str(tmp_path / "empty")
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(c)
    assert str(e.value) == (f"tokenizer.tokenizer_name_or_path (the tokenizer of {where}): {tmp_path / 'empty'}: "
                            f"folder has no tokenizer.json; set tokenizer.tokenizer_name_or_path to a tokenizer.json "
                            f"(or a folder holding one)")
    bad = tmp_path / "bad"  # a tokenizer whose declared EOS it does not hold: found by the job, before any work
    bad.mkdir()
    (bad / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    (bad / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<zzz>"}))
    c.tokenizer.tokenizer_name_or_path = str(bad)
    with pytest.raises(ConfigError) as e:
        resolve_stage_folders(c)
    assert str(e.value) == (f"{where}: {bad / 'tokenizer_config.json'}: eos_token '<zzz>' is not in the tokenizer "
                            f"{bad / 'tokenizer.json'}; fix it or set tokenizer.eos_token: TOKEN in the config")
    assert capsys.readouterr().out == ""  # no "is tokenized into" line before these errors


def test_the_cache_is_tokenized_by_the_tokenize_job_with_its_fastest_exact_backend(tmp_path, tokenizer, eos_id):
    """The stage cache goes through `nanoset tokenize`'s own encoders: fastokens where it is installed, the ids
    tokenizers gives."""
    pytest.importorskip("fastokens")
    from nanoset.tokenize.backends import _version

    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    folder = resolve_stage_folders(hf_config(tmp_path, source))[0][0]
    manifest = json.loads((Path(folder) / "nanoset.json").read_text())
    assert manifest["encoders"] == [f"fastokens {_version('fastokens')}"]
    reader = open_dataset(folder)
    assert [reader.document(i).tolist() for i in range(200)] == [tokenizer.encode(t).ids + [eos_id] for t in TEXTS]


def test_the_cache_folder_changes_with_the_registered_tokens_and_the_mask_rule(tmp_path, monkeypatch):
    """Tokens declared beside tokenizer.json change the ids, and another mask rule changes which tokens an SFT
    stage trains: either makes another dataset, so another cache folder (plain stages of a tokenizer that
    registers nothing keep theirs)."""
    import shutil

    import runtime.data.hf_datasets as hf_datasets

    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    c = hf_config(tmp_path, source)
    c.tokenizer.tokenizer_name_or_path = str(folder)
    ds = c.data_stages[0].data.dataset
    plain = hf_datasets.cache_folder(c, ds)
    config_file = folder / "tokenizer_config.json"
    declared = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**declared, "additional_special_tokens": ["<tool>"]}))
    registered = hf_datasets.cache_folder(c, ds)
    assert registered != plain
    config_file.write_text(json.dumps(declared))
    assert hf_datasets.cache_folder(c, ds) == plain
    ds.sft = True
    sft = hf_datasets.cache_folder(c, ds)
    from nanoset.tokenize import job

    monkeypatch.setattr(job, "MASK_RULE", job.MASK_RULE + 1)  # the job's plan says which rule
    assert len({plain, registered, sft, hf_datasets.cache_folder(c, ds)}) == 4


def test_the_trainer_the_check_and_the_notes_name_a_stage_by_its_source(shards, tmp_path):
    """A Hugging Face stage reads its cache folder (`texts.jsonl-<digest>`), which says nothing of where the data
    came from: the trainer's stage line, `nanoset train --check`'s plan and the start-up notes name the source and
    the folder it was tokenized in (`--check` named the cache folder alone)."""
    from runtime.cli.launch import plan_report
    from runtime.config.load import load_config
    from runtime.startup import start_up, startup_notes
    from tests.support.configs import small_config
    from tests.support.harness import train_one

    src = write_jsonl(tmp_path / "texts.jsonl", TEXTS)
    stage = {"name": "docs", "start_training_step": 1,
             "data": {"num_loading_workers": 0, "dataset": {"hf_dataset_or_datasets": str(src)}}}
    common = dict(data_stages=[stage], general={"cache_dir": str(tmp_path / "cache")}, model={"vocab_size": 8192},
                  tokenizer={"tokenizer_name_or_path": str(TOKENIZER)}, lr_scheduler={"warmup_steps": 0})
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=1, interval=0, **common)
    proc = train_one(cfg, shards)
    (folder,) = resolve_stage_folders(load_config(cfg))[0]  # tokenized by the run: here found in the cache
    assert Path(folder).parent == tmp_path / "cache"
    named = f"{src} (tokenized in {folder})"
    assert (f"stage 'docs' at step 1 (steps 1-1): datasets texts.jsonl: {named} (1), sequence length 32, 0 of 2 "
            f"samples already consumed\n") in proc.stdout  # the source's name (its file's), then what it reads
    report = plan_report(start_up(load_config(cfg), world=1, lock=False).plan)
    assert report[1] == f"  {named} (weight 1): 2 of its 243 samples, 64 tokens, 0.01 epochs"
    many = small_config(tmp_path, tmp_path / "many", dp=1, steps=1000, interval=0, name="many.yaml", **common)
    (note,) = startup_notes(start_up(load_config(many), world=1, lock=False))
    assert note == (f"stage 'docs' reads {named} up to 8.23 epochs: its samples repeat (add data, or fewer steps or a "
                    f"lower weight for it)")


def test_a_plan_of_an_unprepared_stage_names_the_function_that_prepares_it_under_both_its_paths(tmp_path):
    """The module was named hf_cache, though runtime.hf is about models: the message names hf_datasets, and the
    old path it named still imports the same function."""
    from runtime.data import DataPlan
    from runtime.data.hf_cache import resolve_stage_folders as old

    assert old is resolve_stage_folders
    with pytest.raises(ConfigError) as e:
        DataPlan(hf_config(tmp_path, tmp_path / "texts.jsonl"))
    assert str(e.value) == ("data_stages[0] (sft) uses a Hugging Face dataset; prepare it first with "
                            "runtime.data.hf_datasets.resolve_stage_folders(config)")


def test_the_stage_cache_knows_the_tokenize_job_by_its_plan_key_alone():
    """The cache key hand-listed what the job puts in its plan, through five of its internals; a new option of
    the job (one more thing that changes the bytes) would have been missed."""
    import ast

    import runtime.data.hf_datasets as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert sorted(m for m in imported if m.startswith("nanoset.tokenize")) == ["nanoset.tokenize"]
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "nanoset.tokenize" for a in node.names}
    assert names == {"TokenizeOptions", "plan_key", "tokenize"}


def test_a_checkpoint_of_a_stage_whose_cache_folder_was_renamed_resumes(tmp_path):
    """A new cache key (a new name for the same tokenized dataset, as the change to the plan key gave every
    existing folder) is tokenized again once, into another folder of the same content: the checkpoint's record
    names the old folder, and the stage continues in the new one."""
    import shutil

    from runtime.data import DataPlan, training_metadata
    from runtime.data.order.record import TrainingMetadata

    source = write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    c = hf_config(tmp_path, source)
    [[folder]] = resolve_stage_folders(c)
    old = tmp_path / "cache" / "docs.jsonl-0123456789abcdef"  # the name an earlier key gave the same dataset
    shutil.copytree(folder, old)
    trained = DataPlan(c, [[str(old)]])
    ckpt = TrainingMetadata.from_json(json.loads(json.dumps(training_metadata(trained, 2).to_json())))
    resumed = DataPlan(c, [[folder]]).resumed_from("ckpt", ckpt)
    assert resumed.stages[0].start_step == 1 and resumed.folders == [folder]
    assert [resumed.data_hash(t) for t in range(1, 5)] == [trained.data_hash(t) for t in range(1, 5)]
