"""Hugging Face Llama in (model.init_from_hf) and out (python -m runtime.export), against transformers itself."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.distributed.checkpoint import FileSystemReader

from conftest import ROOT, TOKENIZER
from dist_harness import run_distributed
from hf_workers import hf_config, logits_worker, resumed_logits_worker

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from nanoset import NanosetError, TokenizerInfo  # noqa: E402
from runtime.config import Config, ConfigError  # noqa: E402
from runtime.hf.export import export_checkpoint  # noqa: E402
from runtime.hf.load import check_hf_weights  # noqa: E402
from runtime.hf.preflight import check_tokenizer  # noqa: E402

VOCAB = 96
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}


def save_hf(folder: Path, tie: bool = False, vocab: int = VOCAB, seed: int = 0, shard: str | None = None,
            **extra) -> Path:
    """A random LlamaForCausalLM (GQA: 4 heads, 2 key/value heads), every weight perturbed (norms too);
    ``shard``: save_pretrained's max_shard_size (several files and an index)."""
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=tie, **extra)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return folder


def reference_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def fixed_ids(vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(5))


def ours(tmp: Path, hf: Path, layout: dict, ids: torch.Tensor, **kw) -> torch.Tensor:
    world = layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
    run_distributed(world, logits_worker, str(hf), layout, ids, str(tmp / "logits.pt"), *kw.values())
    return torch.load(tmp / "logits.pt")


@pytest.mark.parametrize("layout", [{}, {"tp": 2}, {"pp": 2}], ids=["dp1", "tp2", "pp2"])
def test_logits_match_transformers_untied(tmp_path, layout):
    hf = save_hf(tmp_path / "hf", shard="20KB" if layout else None)  # tp 2, pp 2: from a sharded folder
    assert (hf / "model.safetensors.index.json").is_file() == bool(layout)
    ids = fixed_ids()
    torch.testing.assert_close(ours(tmp_path, hf, layout, ids), reference_logits(hf, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout,resumed_in", [({}, {"tp": 2}), ({"dp": 2}, {"pp": 2}), ({"tp": 2}, {}), ({"pp": 2}, {}),
                                               ({"pp": 2, "tp": 2}, {"tp": 2})],
                         ids=["dp1", "dp2-fsdp", "tp2", "pp2", "pp2-tp2"])
def test_logits_match_transformers_tied(tmp_path, layout, resumed_in):
    """Tied: one tensor in and out, also when pp puts embedding and head on different ranks (the export
    of each checkpoint is the original file's tensors; it resumes in another layout)."""
    hf = save_hf(tmp_path / "hf", tie=True)
    ids = fixed_ids()
    with safetensors_torch.safe_open(hf / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # a tied model stores the embedding once
    logits = ours(tmp_path, hf, layout, ids, checkpoint=str(tmp_path / "ckpt"), tokenizer=None)
    torch.testing.assert_close(logits, reference_logits(hf, ids), rtol=0, atol=1e-5)
    (step,) = (tmp_path / "ckpt").glob("step-*")
    saved = FileSystemReader(step).read_metadata().state_dict_metadata
    assert sorted(k for k in saved if "embed" in k or "lm_head" in k) == [  # the tied weight once, any layout
        "model.embed_tokens.weight", "optimizer.embed_tokens.weight.exp_avg",
        "optimizer.embed_tokens.weight.exp_avg_sq", "optimizer.embed_tokens.weight.step"]
    world = resumed_in.get("tp", 1) * resumed_in.get("pp", 1)
    run_distributed(world, resumed_logits_worker, str(hf), resumed_in, ids, str(tmp_path / "resumed.pt"),
                    str(tmp_path / "ckpt"))
    torch.testing.assert_close(torch.load(tmp_path / "resumed.pt"), logits, rtol=0, atol=1e-5)
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    original, exported = tensors(hf), tensors(out)
    assert sorted(exported) == sorted(original) and all(torch.equal(exported[n], t) for n, t in original.items())
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert "no tokenizer recorded" in json.loads((out / "nanoset_export.json").read_text())["tokenizer"]


def test_llama31_rope_scaling_and_head_dim_match_transformers(tmp_path):
    """Llama 3.1 rope scaling (positions past original_max_position_embeddings) and a head_dim ≠ hidden/heads."""
    hf = save_hf(tmp_path / "hf", rope_scaling=dict(LLAMA3), head_dim=16)  # transformers edits it
    config = hf_config(hf, tp=2)
    assert dataclasses.asdict(config.model.rope_scaling) == LLAMA3
    assert config.model.head_dim == 16 and config.model.head_size == 16
    ids = fixed_ids()
    theirs = reference_logits(hf, ids)
    torch.testing.assert_close(ours(tmp_path, hf, {"tp": 2}, ids), theirs, rtol=0, atol=1e-5)
    # the scaling matters here: without it the logits differ
    plain = save_hf(tmp_path / "plain", head_dim=16)
    assert (reference_logits(plain, ids) - theirs).abs().max() > 1e-3


def test_exported_config_json_reproduces_llama31_scaling(tmp_path):
    """The config.json export writes (both rope forms, head_dim) makes transformers compute the same logits."""
    from runtime.hf.config_map import hf_config_json

    hf = save_hf(tmp_path / "hf", rope_scaling=dict(LLAMA3), head_dim=16)
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(1))  # far past 8 positions
    theirs = reference_logits(hf, ids)
    cfg = hf_config_json(hf_config(hf).model, bos_id=None, eos_id=0, dtype="float32")
    assert cfg["rope_parameters"] == {**LLAMA3, "rope_theta": 5000.0} and cfg["rope_scaling"] == LLAMA3
    (hf / "config.json").write_text(json.dumps(cfg))
    torch.testing.assert_close(reference_logits(hf, ids), theirs, rtol=0, atol=0)


def test_transformers4_config_form(tmp_path):
    """rope_theta and rope_scaling at the top level (transformers 4) read as rope_parameters (5)."""
    hf = save_hf(tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0})
    (hf / "config.json").write_text(json.dumps(cfg))
    m = hf_config(hf).model
    assert (m.rope_theta, m.rope_scaling.rope_type, m.rope_scaling.factor) == (123.0, "linear", 2.0)
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0}  # the 5 form wins, rope_theta beside it
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="rope scaling 'dynamic' is not supported"):
        hf_config(hf)
    assert (m.hidden_size, m.num_hidden_layers, m.num_key_value_heads, m.vocab_size, m.rms_norm_eps) == (
        32, 2, 2, VOCAB, 1e-5)


# ---------------------------------------------------------------------------------------------- export


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


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


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
    assert again.returncode == 1 and again.stderr == f"error: {out}: exists; remove it or choose another output folder\n"
    bad = subprocess.run(cli + [str(tmp_path), str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and bad.stderr.startswith(f"error: {tmp_path}: no metadata.json;")
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
    assert str(e.value) == (f"{tmp_path / 'file' / 'out'}: cannot create the output folder there (File exists); "
                            f"choose another output folder")
    with pytest.raises(FileNotFoundError) as e:
        export_checkpoint(tmp_path / "file", tmp_path / "out")
    assert str(e.value) == (f"{tmp_path / 'file'}: not a folder; give a step-N checkpoint folder (or the "
                            f"checkpoints folder, for its latest)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and not (ckpt / "hf").exists()


def test_export_reads_metadata_of_another_version_or_refuses_it_in_one_line(saved_from_hf, tmp_path):
    """A tokenizer record with a key this version lacks was a TypeError traceback; model sizes missing too."""
    import shutil

    _, ckpt, _, _ = saved_from_hf
    copy = tmp_path / "step-000000"
    shutil.copytree(ckpt, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta["tokenizer"]["added_in_a_later_version"] = 1
    (copy / "metadata.json").write_text(json.dumps(meta))
    out = export_checkpoint(copy, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 0
    del meta["config"]["model"]["hidden_size"]
    (copy / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError) as e:
        export_checkpoint(copy, tmp_path / "out2")
    assert str(e.value) == (f"{copy / 'metadata.json'}: config.model records no hidden_size; is it a checkpoint of "
                            f"this runtime?")


# ---------------------------------------------------------------------------------------------- bad input


def write_yaml(tmp: Path, hf: Path, **model) -> Path:
    from hf_workers import BASE

    d = json.loads(json.dumps(BASE))
    d["model"] = {"init_from_hf": str(hf), **model}
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_sizes_come_from_config_json_and_must_agree(tmp_path):
    hf = save_hf(tmp_path / "hf")
    c = Config.from_yaml(write_yaml(tmp_path, hf, num_hidden_layers=2, rope_theta=5000.0))
    assert (c.model.hidden_size, c.model.intermediate_size, c.model.max_position_embeddings) == (32, 48, 64)
    with pytest.raises(ConfigError) as e:
        Config.from_yaml(write_yaml(tmp_path, hf, hidden_size=64))
    assert str(e.value) == (f"{tmp_path / 'cfg.yaml'}: model.hidden_size: 64 in the config but 32 in "
                            f"{hf / 'config.json'} (model.init_from_hf); remove the key or make them agree")
    with pytest.raises(ConfigError, match=r"model.rms_norm_eps: 1e-06 in the config but 1e-05 in"):
        Config.from_yaml(write_yaml(tmp_path, hf, rms_norm_eps=1e-6))
    with pytest.raises(ConfigError, match=r"config.model.hidden_size: required key is missing \(give it, or "
                                          r"model.init_from_hf: PATH"):
        Config.from_yaml(write_yaml(tmp_path, hf, init_from_hf=None))


def edit_config(hf: Path, **changes) -> None:
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(changes)
    (hf / "config.json").write_text(json.dumps(cfg))


def test_wrong_architecture_and_unsupported_rope_are_one_line(tmp_path):
    hf = save_hf(tmp_path / "hf")
    edit_config(hf, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError) as e:
        Config.from_yaml(write_yaml(tmp_path, hf))
    assert str(e.value).endswith(f"model.init_from_hf: {hf / 'config.json'}: architectures ['GPT2LMHeadModel'] is "
                                 f"not one of ['LlamaForCausalLM', 'MistralForCausalLM']; only Llama-style models can "
                                 f"be imported")
    edit_config(hf, architectures=["MistralForCausalLM"], sliding_window=4096)
    with pytest.raises(ConfigError, match="sliding_window 4096 is not supported"):
        Config.from_yaml(write_yaml(tmp_path, hf))
    edit_config(hf, sliding_window=None, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ConfigError, match="rope scaling 'yarn' is not supported \\(only linear and llama3\\)"):
        Config.from_yaml(write_yaml(tmp_path, hf))
    with pytest.raises(FileNotFoundError, match="model.init_from_hf: .*nowhere: no such folder"):
        Config.from_yaml(write_yaml(tmp_path, tmp_path / "nowhere"))


@pytest.mark.parametrize("changes, fragment", [
    ({"rope_parameters": None, "rope_scaling": "linear"}, "rope_scaling is 'linear', not an object"),
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor is missing"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "5e3"}}, "rope_parameters.rope_theta is '5e3', not a "
                                                                        "number"),
    ({"rope_parameters": dict(LLAMA3, factor="8")}, "rope_parameters.factor is '8', not a number"),
    ({"head_dim": "8"}, "head_dim is missing or not an integer"),
    ({"num_key_value_heads": 2.0}, "num_key_value_heads is missing or not an integer"),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps is '1e-5', not a number"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings is 'yes', not true or false"),
])
def test_config_json_values_of_the_wrong_type_are_one_line(tmp_path, changes, fragment):
    """Were TypeError/ValueError/KeyError tracebacks (or, for "yes", a silently tied model)."""
    hf = save_hf(tmp_path / "hf")
    edit_config(hf, **changes)
    with pytest.raises(ConfigError) as e:
        Config.from_yaml(write_yaml(tmp_path, hf))
    assert str(e.value) == f"{tmp_path / 'cfg.yaml'}: model.init_from_hf: {hf / 'config.json'}: {fragment}"


def test_a_safetensors_index_without_a_weight_map_of_file_names_is_one_line(tmp_path):
    hf = save_hf(tmp_path / "hf", shard="20KB")
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [["model.norm.weight", "a"]]}))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(hf_config(hf).model)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'model.safetensors.index.json'}: not a safetensors index "
                            f"(weight_map must map tensor names to file names)")


def rewrite_weights(hf: Path, change) -> None:
    state = safetensors_torch.load_file(hf / "model.safetensors")
    change(state)
    safetensors_torch.save_file(state, hf / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_shape_mismatch_and_corrupt_file(tmp_path):
    hf = save_hf(tmp_path / "hf")
    model = hf_config(hf).model
    check_hf_weights(model)  # the intact folder passes
    rewrite_weights(hf, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(model)
    assert str(e.value) == (f"model.init_from_hf: {hf}: tensor model.layers.1.mlp.up_proj.weight is missing (needed "
                            f"for our layers.1.mlp.up_proj.weight); is it a complete checkpoint of this model?")
    rewrite_weights(hf, lambda s: s.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(48, 30)}))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(model)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'model.safetensors'}: tensor model.layers.1.mlp.up_proj.weight "
                            f"has shape [48, 30], but the model (config.json) needs [48, 32]")
    data = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=f"model.init_from_hf: {hf / 'model.safetensors'}: not a valid safetensors "
                                          f"file .*; download or save it again"):
        check_hf_weights(model)
    (hf / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ConfigError, match="not a valid safetensors file"):
        check_hf_weights(model)
    sharded = save_hf(tmp_path / "sharded", shard="20KB")
    check_hf_weights(hf_config(sharded).model)
    (sharded / "model-00003-of-00005.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as e:
        check_hf_weights(hf_config(sharded).model)
    assert str(e.value) == (f"model.init_from_hf: {sharded / 'model-00003-of-00005.safetensors'}: missing "
                            f"(model.safetensors.index.json names it)")


def test_tokenizer_must_be_the_datas(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    data = TokenizerInfo(name="tokenizer", vocab_size=1494, sha256=hashlib.sha256(
        (TOKENIZER / "tokenizer.json").read_bytes()).hexdigest())
    check_tokenizer(hf, data)  # no tokenizer.json in the model folder: nothing to compare
    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    check_tokenizer(hf, data)
    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes() + b"\n")
    other = hashlib.sha256((hf / "tokenizer.json").read_bytes()).hexdigest()
    with pytest.raises(ConfigError) as e:
        check_tokenizer(hf, data)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'tokenizer.json'} (sha256 {other[:12]}) is not the tokenizer "
                            f"the data was made with ('tokenizer' sha256 {data.sha256[:12]}); tokenize the data with "
                            f"the model's tokenizer")


# ---------------------------------------------------------------------------------------------- a training run


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


def test_training_starts_from_hf_and_exports_at_the_end(tmp_path, tokenizer):
    """A run from an HF folder (with the data's tokenizer.json) ends with run_dir/hf; lr 1e-12 leaves the
    weights as they were loaded, so the export equals the original; a wrong tokenizer or tensor is one line."""
    from conftest import CORPUS, run_cli
    from trainhelpers import error_lines, torchrun, train_one

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
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "metadata.json").read_text())
    assert (meta["tokenizer"]["eos_id"], meta["tokenizer"]["path"]) == (eos, str(TOKENIZER / "tokenizer.json"))
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

    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes() + b" ")
    bad = train_one(run_config(tmp_path, hf, data, "bad-tok"), cwd=tmp_path, check=False)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(lines) == 1 and lines[0].startswith(
        f"error: model.init_from_hf: {hf / 'tokenizer.json'} (sha256 ")
    (hf / "tokenizer.json").unlink()
    rewrite_weights(hf, lambda s: s.pop("model.norm.weight"))
    bad = train_one(run_config(tmp_path, hf, data, "bad-weights"), cwd=tmp_path, check=False)
    assert bad.returncode == 1 and bad.stderr == (
        f"error: model.init_from_hf: {hf}: tensor model.norm.weight is missing (needed for our norm.weight); is it a "
        f"complete checkpoint of this model?\n")


def test_export_hf_needs_save_final(tmp_path):
    from hf_workers import BASE

    d = json.loads(json.dumps(BASE))
    d["model"] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
                  "vocab_size": 96, "max_position_embeddings": 64}
    d["checkpoints"] = {"export_hf": True, "save_final": False}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        Config.from_yaml(tmp_path / "c.yaml")
    assert str(e.value) == (f"{tmp_path / 'c.yaml'}: checkpoints.export_hf: exports the final checkpoint, but "
                            f"checkpoints.save_final is false; set save_final: true or export a checkpoint with "
                            f"python -m runtime.export")


def test_a_pipeline_stage_opens_only_the_files_of_its_tensors(tmp_path, monkeypatch):
    """The second of two pipeline chunks (layer 1, norm, head) reads from the shard files that hold them, no other."""
    import safetensors

    from runtime.hf.load import hf_name, load_hf_weights
    from runtime.models.llama import LlamaChunk

    hf = save_hf(tmp_path / "hf", shard="20KB")
    weight_map = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    opened = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, *a, **k: opened.append(Path(path).name) or real(
        path, *a, **k))
    chunk = LlamaChunk(hf_config(hf).model, 1, 2)
    assert load_hf_weights([chunk], hf) == 9 + 2  # layer 1 (two norms, four attention, three MLP), norm, head
    needed = {weight_map[hf_name(n)] for n, _ in chunk.named_parameters()}
    assert sorted(opened) == sorted(needed) and len(needed) < len(set(weight_map.values()))
    original = tensors(hf)
    for name, p in chunk.named_parameters():
        assert torch.equal(p.detach(), original[hf_name(name)]), name


def test_a_tied_model_whose_file_holds_another_head_is_refused(tmp_path):
    """A tied config.json whose weights also hold a *different* ``lm_head.weight``: transformers keeps both
    (untied), so taking the embedding as the head would silently give other logits (was: max 22 apart)."""
    hf = save_hf(tmp_path / "hf", tie=True)
    rewrite_weights(hf, lambda s: s.__setitem__("lm_head.weight", s["model.embed_tokens.weight"].clone()))
    check_hf_weights(hf_config(hf).model)  # an equal copy is a tied model saved with both names: fine
    rewrite_weights(hf, lambda s: s["lm_head.weight"].mul_(-1))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(hf_config(hf).model)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'model.safetensors'}: lm_head.weight differs from "
                            f"model.embed_tokens.weight, but config.json says tie_word_embeddings: true (transformers "
                            f"would not tie them); set \"tie_word_embeddings\": false in a copy of "
                            f"{hf / 'config.json'} to train them untied")
    edit_config(hf, tie_word_embeddings=False)  # what the message says: the two weights, untied
    ids = fixed_ids()
    torch.testing.assert_close(ours(tmp_path, hf, {}, ids), reference_logits(hf, ids), rtol=0, atol=1e-5)
