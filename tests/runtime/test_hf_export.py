"""Hugging Face Llama out (python -m runtime.export, checkpoints.export_hf): bit-identical round trips that
transformers loads, and a training run from an HF folder that exports at the end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.support import ROOT, TOKENIZER
from tests.support.harness import run_distributed
from tests.support.hf_workers import logits_worker

pytest.importorskip("transformers")

from nanoset import NanosetError, TokenizerInfo  # noqa: E402
from runtime.checkpoint.record import read_metadata  # noqa: E402
from runtime.config import ConfigError  # noqa: E402
from runtime.config.load import load_config
from runtime.hf.export import export_checkpoint  # noqa: E402
from tests.support.hf_models import (
    fixed_ids,
    reference_logits,
    rewrite_weights,
    safetensors_torch,
    save_hf,
    tensors,
    transformers,
)


@pytest.fixture(scope="module")
def saved_from_hf(tmp_path_factory):
    """An HF model loaded into a dp 2 × tp 2 layout (FSDP2 + DTensor shards) and saved as a checkpoint."""
    tmp = tmp_path_factory.mktemp("export")
    hf = save_hf(tmp / "hf")
    info = TokenizerInfo(name="tokenizer", vocab_size=1494, eos_id=0, eos_token="<|endoftext|>", bos_id=None,
                         sha256=hashlib.sha256((TOKENIZER / "tokenizer.json").read_bytes()).hexdigest(),
                         path=str(TOKENIZER / "tokenizer.json"))
    ids = fixed_ids()
    run_distributed(4, logits_worker, str(hf), {"dp": 2, "tp": 2}, ids, str(tmp / "logits.pt"), str(tmp / "ckpt"),
                    dataclasses.asdict(info))
    return hf, tmp / "ckpt" / "step-000000", torch.load(tmp / "logits.pt"), ids


def test_export_round_trip_is_bit_identical_and_loads_in_transformers(saved_from_hf, tmp_path):
    hf, ckpt, our_logits, ids = saved_from_hf
    theirs = reference_logits(hf, ids)
    torch.testing.assert_close(our_logits, theirs, rtol=0, atol=1e-5)  # dp 2 × tp 2 loaded right
    out = export_checkpoint(ckpt, tmp_path / "out")
    original, exported = tensors(hf), tensors(out)
    assert sorted(exported) == sorted(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    with safetensors_torch.safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and (cfg["bos_token_id"], cfg["eos_token_id"]) == (None, 0)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 0
    assert (out / "tokenizer.json").read_bytes() == (TOKENIZER / "tokenizer.json").read_bytes()
    assert (out / "tokenizer_config.json").read_bytes() == (TOKENIZER / "tokenizer_config.json").read_bytes()
    torch.testing.assert_close(reference_logits(out, ids), theirs, rtol=0, atol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.eos_token_id == 0


def test_export_sharded_bf16_cli(saved_from_hf, tmp_path):
    """Over the shard size: several files and an index, as save_pretrained writes them; --dtype bfloat16."""
    hf, ckpt, _, ids = saved_from_hf
    out = tmp_path / "out"
    from runtime.hf import export as export_module

    export_checkpoint(ckpt, out, dtype="bfloat16", max_shard_bytes=8000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(p.name for p in out.glob("*.safetensors")) == files
    original = tensors(hf)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in original.values())
    exported = tensors(out)
    assert all(torch.equal(exported[n], t.to(torch.bfloat16)) for n, t in original.items())
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.model.layers[1].self_attn.k_proj.weight.dtype == torch.bfloat16
    assert export_module.MAX_SHARD_BYTES == 5 * 10**9
    # the command line: the checkpoints folder stands for its latest; an existing output is refused in one line
    cli = [sys.executable, "-m", "runtime.export"]
    proc = subprocess.run(cli + [str(ckpt.parent), str(tmp_path / "cli"), "--dtype", "bfloat16"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"exported {ckpt.parent} to {tmp_path / 'cli'} (tokenizer files from")
    assert tensors(tmp_path / "cli").keys() == original.keys()
    again = subprocess.run(cli + [str(ckpt), str(out)], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1
    assert again.stderr == f"error: {out}: exists; remove it or choose another output folder\n"
    bad = subprocess.run(cli + [str(tmp_path), str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and bad.stderr == (f"error: checkpoint {tmp_path}: no metadata.json; it is not a "
                                                  f"complete checkpoint (give a step-N folder as the checkpoint)\n")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".tmp-*"))
    import shutil

    torn = tmp_path / "torn"
    shutil.copytree(ckpt, torn)
    victim = sorted(torn.glob("*.distcp"))[-1]
    victim.unlink()
    proc = subprocess.run(cli + [str(torn), str(tmp_path / "y")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and proc.stderr == (f"error: {torn}: the DCP files are unreadable ([Errno 2] No such "
                                                    f"file or directory: '{victim}'); choose another checkpoint\n")
    assert not (tmp_path / "y").exists() and not list(tmp_path.glob(".tmp-*"))


def test_export_output_folder_mistakes_are_one_line(saved_from_hf, tmp_path):
    """An output inside the checkpoint (pruned with it), one that cannot be created, a file as checkpoint."""
    _, ckpt, _, _ = saved_from_hf
    with pytest.raises(ConfigError) as e:
        export_checkpoint(ckpt, ckpt / "hf")
    assert str(e.value) == (f"{ckpt / 'hf'}: inside the checkpoint {ckpt} (deleted with it when the run prunes old "
                            f"checkpoints); choose an output folder outside it")
    (tmp_path / "file").write_text("")
    with pytest.raises(NanosetError) as e:
        export_checkpoint(ckpt, tmp_path / "file" / "out")
    assert str(e.value) == (f"{tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is a file, not a folder; choose "
                            f"another output folder")
    with pytest.raises(FileNotFoundError) as e:
        export_checkpoint(tmp_path / "file", tmp_path / "out")
    assert str(e.value) == (f"checkpoint {tmp_path / 'file'}: not a folder; give a step-N checkpoint folder (or a "
                            f"checkpoints folder, for its latest) as the checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and not (ckpt / "hf").exists()


def test_export_reads_metadata_of_another_version_or_refuses_it_in_one_line(saved_from_hf, tmp_path):
    """A tokenizer record with a key this version lacks was a TypeError traceback; model sizes missing too."""
    import shutil

    _, ckpt, _, _ = saved_from_hf
    copy = tmp_path / "step-000000"
    shutil.copytree(ckpt, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta["tokenizer"]["info"]["added_in_a_later_version"] = 1
    (copy / "metadata.json").write_text(json.dumps(meta))
    out = export_checkpoint(copy, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 0
    del meta["config"]["model"]["hidden_size"]
    (copy / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError) as e:
        export_checkpoint(copy, tmp_path / "out2")
    assert str(e.value) == (f"{copy / 'metadata.json'}: config.model records no hidden_size; is it a checkpoint of "
                            f"this runtime?")


def test_an_export_without_the_datas_tokenizer_says_why(saved_from_hf, tmp_path):
    """A dataset tokenized with a relative --tokenizer recorded that path as given: an export from another
    directory said "is gone" (or wrote nothing). The note says what the path was relative to and what to do."""
    import shutil

    _, ckpt, _, _ = saved_from_hf
    copy = tmp_path / "step-000000"
    shutil.copytree(ckpt, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta["tokenizer"]["info"]["path"] = "data_fixtures/tokenizer/tokenizer.json"
    (copy / "metadata.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "-m", "runtime.export", str(copy), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"exported {copy} to {tmp_path / 'out'} (the data's tokenizer "
                           f"data_fixtures/tokenizer/tokenizer.json is recorded relative to the directory the data was "
                           f"tokenized in, and not found from {tmp_path}: tokenizer files not written; copy its "
                           f"tokenizer.json (and tokenizer_config.json) into the output folder, or pass --tokenizer "
                           f"DIR)\n")
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def run_config(tmp: Path, hf: Path, data: Path, run: str) -> Path:
    d = {"general": {"project": "t", "run": run, "seed": 1, "run_dir": str(tmp / run)},
         "model": {"init_from_hf": str(hf)},
         "tokens": {"sequence_length": 16, "micro_batch_size": 2, "train_steps": 2},
         "optimizer": {"learning_rate": 1e-12, "weight_decay": 0.0},
         "lr_scheduler": {"decay_style": "constant"},
         "checkpoints": {"export_hf": True},
         "logging": {"tensorboard": False},
         "data_stages": [{"name": "s", "start_training_step": 1,
                          "data": {"num_loading_workers": 0, "dataset": {"dataset_folder": str(data)}}}]}
    path = tmp / f"{run}.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_zero_train_steps_are_an_exact_hf_checkpoint_hf_round_trip(tmp_path):
    """train_steps 0 was refused: a round trip needed a step at a learning rate of 1e-30. Now the run loads the
    Hugging Face weights, saves them as checkpoint step 0 and exports them: bit-identical tensors."""
    from tests.support import CORPUS, run_cli
    from tests.support.harness import train_one

    data = tmp_path / "web"
    run_cli("tokenize", CORPUS / "web", "-o", data, "--tokenizer", TOKENIZER, "--quiet")
    hf = save_hf(tmp_path / "hf", vocab=1536)
    cfg = run_config(tmp_path, hf, data, "zero")
    d = yaml.safe_load(cfg.read_text())
    d["tokens"]["train_steps"] = 0
    cfg.write_text(yaml.safe_dump(d))
    proc = train_one(cfg, cwd=tmp_path)
    assert re.fullmatch(  # no "metrics: PATH" of a file that was never written
        rf"done: step 0/0 in \d+:\d\d; final loss per stage: none \(nothing left to train\); checkpoint: "
        rf"{re.escape(str(tmp_path / 'zero' / 'checkpoints' / 'step-000000'))}", proc.stdout.splitlines()[-1])
    assert (tmp_path / "zero" / "checkpoints" / "latest").read_text() == "step-000000\n"
    exported, original = tensors(tmp_path / "zero" / "hf"), tensors(hf)
    assert sorted(exported) == sorted(original) and all(torch.equal(exported[k], t) for k, t in original.items())
    assert not (tmp_path / "zero" / "metrics.jsonl").exists()  # no step, no row


def test_training_starts_from_hf_and_exports_at_the_end(tmp_path, tokenizer):
    """A run from an HF folder (with the data's tokenizer.json) ends with run_dir/hf; lr 1e-12 leaves the
    weights as they were loaded, so the export equals the original; a wrong tokenizer or tensor is one line."""
    from tests.support import CORPUS, run_cli
    from tests.support.harness import error_lines, torchrun, train_one

    data = tmp_path / "web"
    run_cli("tokenize", CORPUS / "web", "-o", data, "--tokenizer", TOKENIZER, "--quiet")
    hf = save_hf(tmp_path / "hf", vocab=1536)
    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    proc = train_one(run_config(tmp_path, hf, data, "run"), cwd=tmp_path)
    assert f"weights from {hf} (model.init_from_hf)" in proc.stdout
    out = tmp_path / "run" / "hf"
    assert f"exported step-000002 to {out} (Hugging Face LlamaForCausalLM)" in proc.stdout
    exported, original = tensors(out), tensors(hf)
    assert sorted(exported) == sorted(original)
    for name, t in original.items():
        torch.testing.assert_close(exported[name], t, rtol=0, atol=1e-9)
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos
    assert (out / "tokenizer.json").read_bytes() == (TOKENIZER / "tokenizer.json").read_bytes()
    info = read_metadata(tmp_path / "run" / "checkpoints" / "step-000002").tokenizer.info
    assert (info.eos_id, info.path) == (eos, str(TOKENIZER / "tokenizer.json"))
    gen = subprocess.run([sys.executable, "tools/hf_generate.py", str(out), "The history of", "--tokens", "3"],
                         capture_output=True, text=True, cwd=ROOT)
    assert gen.returncode == 0 and gen.stdout.startswith(f"transformers loaded {out}: 'The history of' → "), gen.stderr

    # dp 2 under torchrun, and an export that fails at the end: one line from rank 0, no rank left waiting
    script = tmp_path / "failing_export.py"
    script.write_text("import sys\nimport runtime.trainer as t\n\n\ndef boom(*args, **kwargs):\n"
                      "    raise OSError(28, 'No space left on device')\n\n\nt.export_checkpoint = boom\n"
                      "from runtime.train import main\n\nsys.exit(main())\n")
    cfg = run_config(tmp_path, hf, data, "dp2")
    d = yaml.safe_load(cfg.read_text())
    d["parallelism"] = {"dp": 2}
    cfg.write_text(yaml.safe_dump(d))
    proc = torchrun(cfg, 2, cwd=tmp_path, script=script, check=False)
    assert proc.returncode != 0
    assert error_lines(proc.stderr) == [
        f"error: checkpoints.export_hf: [Errno 28] No space left on device; the run and its checkpoint "
        f"{tmp_path / 'dp2' / 'checkpoints' / 'step-000002'} are complete: export it with python -m runtime.export"]
    assert f"weights from {hf} (model.init_from_hf)" in proc.stdout and not (tmp_path / "dp2" / "hf").exists()

    # another tokenizer (a byte-different file that encodes alike is the same one: see test_hf_errors)
    other = json.loads((TOKENIZER / "tokenizer.json").read_text())
    other["model"]["vocab"] = {t: (i + 1) % len(other["model"]["vocab"]) for t, i in other["model"]["vocab"].items()}
    (hf / "tokenizer.json").write_text(json.dumps(other))
    bad = train_one(run_config(tmp_path, hf, data, "bad-tok"), cwd=tmp_path, check=False)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(lines) == 1 and lines[0].startswith(
        f"error: model.init_from_hf: {hf / 'tokenizer.json'} does not encode as the tokenizer the data was made with")
    (hf / "tokenizer.json").unlink()
    rewrite_weights(hf, lambda s: s.pop("model.norm.weight"))
    bad = train_one(run_config(tmp_path, hf, data, "bad-weights"), cwd=tmp_path, check=False)
    assert bad.returncode == 1 and bad.stderr == (
        f"error: model.init_from_hf: {hf}: tensor model.norm.weight is missing (needed for our norm.weight); is it a "
        f"complete checkpoint of this model?\n")


def test_export_hf_needs_save_final(tmp_path):
    from tests.support.configs import HF_BASE as BASE

    d = json.loads(json.dumps(BASE))
    d["model"] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
                  "vocab_size": 96, "max_position_embeddings": 64}
    d["checkpoints"] = {"export_hf": True, "save_final": False}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "c.yaml")
    assert str(e.value) == (f"{tmp_path / 'c.yaml'}: checkpoints.export_hf: exports the final checkpoint, but "
                            f"checkpoints.save_final is false; set save_final: true or export a checkpoint with "
                            f"python -m runtime.export")
