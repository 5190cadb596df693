"""Hugging Face folders with mistakes (config.json values, index, tensors, tokenizer): one line each."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.support import TOKENIZER
from tests.support.configs import hf_config

pytest.importorskip("transformers")

from nanoset import TokenizerInfo  # noqa: E402
from runtime.config import ConfigError  # noqa: E402
from runtime.config.load import load_config
from runtime.hf.load import check_hf_weights  # noqa: E402
from runtime.hf.preflight import check_model_tokenizer  # noqa: E402
from tests.support.hf_models import LLAMA3, edit_config, rewrite_weights, save_hf, write_yaml  # noqa: E402


def test_sizes_come_from_config_json_and_must_agree(tmp_path):
    hf = save_hf(tmp_path / "hf")
    c = load_config(write_yaml(tmp_path, hf, num_hidden_layers=2, rope_theta=5000.0))
    assert (c.model.hidden_size, c.model.intermediate_size, c.model.max_position_embeddings) == (32, 48, 64)
    with pytest.raises(ConfigError) as e:
        load_config(write_yaml(tmp_path, hf, hidden_size=64))
    assert str(e.value) == (f"{tmp_path / 'cfg.yaml'}: model.hidden_size: 64 in the config but 32 in "
                            f"{hf / 'config.json'} (model.init_from_hf); remove the key or make them agree")
    with pytest.raises(ConfigError, match=r"model.rms_norm_eps: 1e-06 in the config but 1e-05 in"):
        load_config(write_yaml(tmp_path, hf, rms_norm_eps=1e-6))
    with pytest.raises(ConfigError, match=r"model.hidden_size: required key is missing \(give it, or "
                                          r"model.init_from_hf: PATH"):
        load_config(write_yaml(tmp_path, hf, init_from_hf=None))


def test_wrong_architecture_and_unsupported_rope_are_one_line(tmp_path):
    hf = save_hf(tmp_path / "hf")
    edit_config(hf, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError) as e:
        load_config(write_yaml(tmp_path, hf))
    assert str(e.value).endswith(f"model.init_from_hf: {hf / 'config.json'}: architectures ['GPT2LMHeadModel'] is "
                                 f"not one of ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', "
                                 f"'Qwen3ForCausalLM']; only Llama-style models can "
                                 f"be imported")
    edit_config(hf, architectures=["MistralForCausalLM"], sliding_window=4096)
    with pytest.raises(ConfigError, match="sliding_window 4096 is not supported"):
        load_config(write_yaml(tmp_path, hf))
    edit_config(hf, sliding_window=None, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ConfigError, match="rope scaling 'yarn' is not supported \\(only linear and llama3\\)"):
        load_config(write_yaml(tmp_path, hf))
    with pytest.raises(FileNotFoundError, match="model.init_from_hf: .*nowhere: no such folder"):
        load_config(write_yaml(tmp_path, tmp_path / "nowhere"))


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
        load_config(write_yaml(tmp_path, hf))
    assert str(e.value) == f"{tmp_path / 'cfg.yaml'}: model.init_from_hf: {hf / 'config.json'}: {fragment}"


def test_a_safetensors_index_without_a_weight_map_of_file_names_is_one_line(tmp_path):
    hf = save_hf(tmp_path / "hf", shard="20KB")
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [["model.norm.weight", "a"]]}))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(hf_config(hf).model)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'model.safetensors.index.json'}: not a safetensors index "
                            f"(weight_map must map tensor names to file names)")


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
    check_model_tokenizer(hf, data)  # no tokenizer.json in the model folder: nothing to compare
    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    check_model_tokenizer(hf, data)
    (hf / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes() + b"\n")
    other = hashlib.sha256((hf / "tokenizer.json").read_bytes()).hexdigest()
    with pytest.raises(ConfigError) as e:
        check_model_tokenizer(hf, data)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'tokenizer.json'} (sha256 {other[:12]}) is not the tokenizer "
                            f"the data was made with ('tokenizer' sha256 {data.sha256[:12]}); tokenize the data with "
                            f"the model's tokenizer")


def test_a_tokenizer_transformers_saved_again_is_the_datas(tmp_path):
    """transformers adds a no-op TemplateProcessing post-processor when it saves a tokenizer: another sha256,
    the same ids; such a model folder was refused. A tokenizer that really encodes otherwise still is, saying how."""
    from transformers import AutoTokenizer

    data = TokenizerInfo(name="tokenizer", vocab_size=1494, path=str(TOKENIZER / "tokenizer.json"),
                         sha256=hashlib.sha256((TOKENIZER / "tokenizer.json").read_bytes()).hexdigest())
    hf = tmp_path / "hf"
    AutoTokenizer.from_pretrained(str(TOKENIZER)).save_pretrained(str(hf))
    assert (hf / "tokenizer.json").read_bytes() != (TOKENIZER / "tokenizer.json").read_bytes()
    check_model_tokenizer(hf, data)
    other = json.loads((hf / "tokenizer.json").read_text())
    other["model"]["vocab"] = {t: (i + 1) % len(other["model"]["vocab"]) for t, i in other["model"]["vocab"].items()}
    (hf / "tokenizer.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError) as e:
        check_model_tokenizer(hf, data)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'tokenizer.json'} does not encode as the tokenizer the data "
                            f"was made with ({TOKENIZER / 'tokenizer.json'}): their vocabularies (or added tokens) "
                            f"differ; tokenize the data with the model's tokenizer")


def _without_merges(source, out, drop: int = 300) -> None:
    """``source``'s tokenizer.json with its last ``drop`` BPE merges removed: the same vocabulary, other ids."""
    d = json.loads(source.read_text())
    d["model"]["merges"] = d["model"]["merges"][:-drop]
    out.write_text(json.dumps(d))


def test_a_tokenizer_file_changed_since_tokenizing_is_not_compared_with(tmp_path):
    """The manifest names the file the data was made with; the comparison encoded with whatever lay there now, so a
    tokenizer edited in place (300 merges removed) and copied into the model folder was accepted: silent wrong
    training. It is compared only while the file still has the manifest's sha256."""
    recorded = tmp_path / "tokmut" / "tokenizer.json"
    recorded.parent.mkdir()
    recorded.write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    original = hashlib.sha256(recorded.read_bytes()).hexdigest()
    data = TokenizerInfo(name="tokmut", vocab_size=1494, path=str(recorded), sha256=original)
    _without_merges(TOKENIZER / "tokenizer.json", recorded)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tokenizer.json").write_bytes(recorded.read_bytes())
    changed = hashlib.sha256(recorded.read_bytes()).hexdigest()
    with pytest.raises(ConfigError) as e:
        check_model_tokenizer(hf, data)
    assert str(e.value) == (
        f"model.init_from_hf: {hf / 'tokenizer.json'} (sha256 {changed[:12]}) is not the tokenizer the data was made "
        f"with ('tokmut' sha256 {original[:12]}), and {recorded}, where the data's manifest says that tokenizer was, "
        f"has changed since (sha256 {changed[:12]}), so the encodings cannot be compared; put the data's tokenizer "
        f"back there, or tokenize the data with the model's tokenizer")


def test_an_encoding_difference_shows_where_the_ids_part(tmp_path):
    """The message showed the first 8 ids of a probe text, the same with both tokenizers; it shows the first
    differing position and the ids around it."""
    data = TokenizerInfo(name="tokenizer", vocab_size=1494, path=str(TOKENIZER / "tokenizer.json"),
                         sha256=hashlib.sha256((TOKENIZER / "tokenizer.json").read_bytes()).hexdigest())
    hf = tmp_path / "hf"
    hf.mkdir()
    _without_merges(TOKENIZER / "tokenizer.json", hf / "tokenizer.json")
    with pytest.raises(ConfigError) as e:
        check_model_tokenizer(hf, data)
    assert str(e.value) == (
        f"model.init_from_hf: {hf / 'tokenizer.json'} does not encode as the tokenizer the data was made with "
        f"({TOKENIZER / 'tokenizer.json'}): a probe text encodes differently from its token 3 on (character 6: "
        f"' 123 1234 12345 12345678'…): its ids 0-6 are [17, 589, 885, 748, 20, 748, 20] with the model's and "
        f"[17, 589, 885, 1374, 1374, 21, 1374] with the data's; tokenize the data with the model's tokenizer")


def test_an_unreadable_model_tokenizer_names_the_key_and_what_to_do(tmp_path):
    data = TokenizerInfo(name="tokenizer", vocab_size=1494, path=str(TOKENIZER / "tokenizer.json"),
                         sha256=hashlib.sha256((TOKENIZER / "tokenizer.json").read_bytes()).hexdigest())
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ConfigError) as e:
        check_model_tokenizer(hf, data)
    assert str(e.value).startswith(f"model.init_from_hf: {hf / 'tokenizer.json'}: not a valid tokenizers JSON file (")
    assert str(e.value).endswith("); save the model's tokenizer there again (or remove the file) and rerun")
