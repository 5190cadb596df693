"""Tiny transformers Llama models saved to folders, their reference logits, and edits of their files:
the shared fixtures of the Hugging Face tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.harness import run_distributed
from tests.support.hf_workers import logits_worker

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

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


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


def write_yaml(tmp: Path, hf: Path, **model) -> Path:
    from tests.support.configs import HF_BASE as BASE

    d = json.loads(json.dumps(BASE))
    d["model"] = {"init_from_hf": str(hf), **model}
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def edit_config(hf: Path, **changes) -> None:
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(changes)
    (hf / "config.json").write_text(json.dumps(cfg))


def rewrite_weights(hf: Path, change) -> None:
    state = safetensors_torch.load_file(hf / "model.safetensors")
    change(state)
    safetensors_torch.save_file(state, hf / "model.safetensors", metadata={"format": "pt"})


def save_family_hf(folder: Path, family: str, tie: bool = False, seed: int = 0, **extra) -> Path:
    """A random ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM`` of ``save_hf``'s sizes (Qwen3 with heads of 16, not
    hidden / heads = 8), every weight perturbed (biases and the per-head norms too)."""
    config_class, model_class = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                                 "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    sizes = {"head_dim": 16} if family == "qwen3" else {}
    cfg = config_class(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=tie, **sizes, **extra)
    torch.manual_seed(seed)
    model = model_class(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def reference_loss(folder: Path, ids: torch.Tensor) -> float:
    """transformers' mean next-token loss over ``ids`` (inputs ``ids[:, :-1]``, labels ``ids[:, 1:]``), fp32."""
    logits = reference_logits(folder, ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).item()
