"""Document-masked attention: each document of a packed row sees only itself, in every layout."""

from __future__ import annotations

import copy

import pytest
import torch

from runtime.config import Config, ConfigError
from runtime.config.load import from_dict
from runtime.config.rules import validate_config
from runtime.models.document_attention import document_ids, document_mask
from runtime.models.llama import LlamaChunk, init_weights
from tests.support.configs import TINY, docmask_config
from tests.support.docmask_workers import ROWS, packed_inputs, packed_logits
from tests.support.harness import run_distributed


def alone_logits(ids: torch.Tensor, attention: str = "causal") -> list[list[torch.Tensor]]:
    """Per row, per document: the logits of that document run alone (positions from 0, causal attention)."""
    config = docmask_config(attention)
    model = LlamaChunk(config.model)
    init_weights(model, config.model, config.general.seed)
    out = []
    with torch.no_grad():
        for r, docs in enumerate(ROWS):
            row, at = [], 0
            for n in docs:
                row.append(model(ids[r : r + 1, at : at + n], torch.arange(n)[None])[0])
                at += n
            out.append(row)
    return out


def assert_each_document_alone(logits: torch.Tensor, ids: torch.Tensor) -> None:
    expected = alone_logits(ids)
    for r, docs in enumerate(ROWS):
        at = 0
        for d, n in enumerate(docs):
            torch.testing.assert_close(logits[r, at : at + n], expected[r][d], atol=1e-5, rtol=0,
                                       msg=f"row {r} document {d}")
            at += n


def test_document_ids_and_mask():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])
    assert document_ids(pos).tolist() == [[0, 0, 0, 1, 1, 2, 3]]
    mask = document_mask(pos, head_dim=8)[0, 0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]


def test_single_process_logits_equal_each_document_alone():
    config = docmask_config()
    model = LlamaChunk(config.model)
    init_weights(model, config.model, config.general.seed)
    ids, pos = packed_inputs()
    with torch.no_grad():
        logits = model(ids, pos)
    assert_each_document_alone(logits, ids)
    # causal attention over the same packed rows does see earlier documents
    causal = LlamaChunk(docmask_config("causal").model)
    init_weights(causal, config.model, config.general.seed)
    with torch.no_grad():
        mixed = causal(ids, pos)
    assert (mixed[0, 5:12] - logits[0, 5:12]).abs().max() > 1e-3
    torch.testing.assert_close(mixed[0, :5], logits[0, :5], atol=1e-5, rtol=0)  # the first document: no difference


@pytest.mark.parametrize("name,world,layout", [
    ("tp2", 2, {"tp": 2}),
    ("pp2-afab", 2, {"pp": 2, "engine": "afab"}),
    ("pp2-1f1b", 2, {"pp": 2, "engine": "1f1b"}),
    ("pp2-interleaved", 2, {"pp": 2, "engine": "interleaved-1f1b"}),
])
def test_parallel_logits_equal_each_document_alone(tmp_path, name, world, layout):
    out = tmp_path / "logits.pt"
    run_distributed(world, packed_logits, layout, str(out))
    assert_each_document_alone(torch.load(out), packed_inputs()[0])


def test_document_attention_needs_position_ids():
    d = copy.deepcopy(TINY)
    d["model"]["attention"] = "document"
    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(s\)\.data\.use_position_ids: model\.attention: "
                                          r"document finds document boundaries where position ids restart"):
        validate_config(from_dict(Config, d, "config"))
    d["data_stages"][0]["data"]["use_position_ids"] = True
    validate_config(from_dict(Config, d, "config"))


def test_label_tokens_reach_every_pipeline_rank():
    from tests.support.docmask_workers import label_tokens_on_every_rank

    run_distributed(2, label_tokens_on_every_rank)


def test_flex_attention_only_on_cuda_for_head_sizes_its_kernels_take():
    from runtime.models.document_attention import use_flex

    cuda = torch.device("cuda")
    assert not use_flex(torch.device("cpu"), 64)
    assert [use_flex(cuda, d) for d in (8, 48, 16, 64, 128)] == [False, False, True, True, True]


def run_packed_sft(tmp_path, world, layout):
    from tests.support.docmask_workers import packed_sft_step

    out = tmp_path / "sft"
    run_distributed(world, packed_sft_step, layout, str(out))
    parts = [torch.load(f"{out}.pp{r}") for r in range(layout.get("pp", 1))]
    grads = {k: v for part in parts for k, v in part["grads"].items()}
    return parts[0]["logits"], parts[-1]["loss"], parts[-1]["label_tokens"], grads


@pytest.fixture(scope="module")
def packed_sft_reference(tmp_path_factory):
    return run_packed_sft(tmp_path_factory.mktemp("sft-ref"), 1, {})


@pytest.mark.parametrize("name,world,layout", [
    ("cp2", 2, {"cp": 2}),  # documents cross the chunk borders (rows of 5+7+3 and 9+7 tokens, chunks of 4)
    ("cp2-tp2", 4, {"cp": 2, "tp": 2}),  # FSDP over cp beside tp: the flattened dp × cp mesh with tp
])
def test_packed_sft_batch_under_context_parallel_equals_one_process(tmp_path, packed_sft_reference, name, world,
                                                                    layout):
    """cp ranks hold the head and tail chunks of every packed row: their logits, gathered back in sequence
    order, equal one process's (and each document alone); the loss over the label tokens and the gradients
    before the first optimizer step are the same arithmetic in another order (float rounding)."""
    ref_logits, ref_loss, ref_tokens, ref_grads = packed_sft_reference
    logits, loss, tokens, grads = run_packed_sft(tmp_path, world, layout)
    assert ref_tokens == tokens == 30  # a document of n ≥ 3 tokens has n - 3 labels: 2+4+0, 6+4, 13, 0+0+0+1
    assert abs(loss - ref_loss) < 1e-5, (loss, ref_loss)
    assert abs(ref_loss - torch.log(torch.tensor(128.0)).item()) < 0.1  # an untrained model: about uniform
    assert sorted(grads) == sorted(ref_grads)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-7, rtol=1e-4, msg=k)
    if layout.get("pp", 1) == 1:
        torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
        assert_each_document_alone(logits, packed_inputs()[0])
