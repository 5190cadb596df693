"""The foreach gradient clip equals the per-parameter clip it replaced, to float rounding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from bench_clip import llama_like_parameters, per_parameter_clip

from runtime.parallel.grad_norm import clip_grad_norm_

CPU = SimpleNamespace(device=torch.device("cpu"), pp_size=1)


def _copy(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


@pytest.mark.parametrize("max_norm", [None, 0.5, 1e9])  # no clip, a clip that shrinks, one that does not
def test_foreach_clip_equals_the_per_parameter_clip(max_norm):
    params = llama_like_parameters(layers=3, hidden=32, vocab=64)
    ref = _copy(params)
    norm = clip_grad_norm_(params, max_norm, CPU)
    ref_norm = per_parameter_clip(ref, max_norm)
    # float32 sums of ~20 k squares in another order: relative rounding ~1e-6
    assert float(norm) == pytest.approx(ref_norm, rel=1e-5)
    if max_norm == 0.5:  # clipped to the limit
        assert float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) == pytest.approx(0.5,
                                                                                                          rel=1e-5)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-7)


def test_the_divisor_is_the_mean_gradient_clipped():
    """Gradients that are sums over N tokens: divided by N and clipped, as the mean gradient would be."""
    params = llama_like_parameters(layers=2, hidden=32, vocab=64)
    ref = _copy(params)
    for r in ref:
        r.grad /= 300.0
    norm = clip_grad_norm_(params, 0.01, CPU, divisor=torch.tensor(300.0))
    assert float(norm) == pytest.approx(per_parameter_clip(ref, 0.01), rel=1e-5)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-9)


def test_counted_parameters_set_the_norm_and_all_are_clipped():
    """A pipeline-tied head copy is clipped but not counted twice in the norm."""
    params = llama_like_parameters(layers=1, hidden=16, vocab=32)
    counted = params[1:]
    norm = clip_grad_norm_(params, None, CPU, counted=counted)
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in counted]))
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
