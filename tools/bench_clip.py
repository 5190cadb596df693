"""Gradient clipping, the engine's ``clip_grad_norm_`` (one ``_foreach_norm`` and one ``_foreach_mul_`` per group
of gradients, a coefficient computed on the device, no host read) against the per-parameter clip it replaced
(one norm and one ``mul_`` per parameter, a host ``float()`` between): CPU time per call and the ratio.

    PYTHONPATH=. python tools/bench_clip.py [--layers 16] [--hidden 256] [--repeats 50] [--rounds 5]

On a GPU the old clip also left the GPU idle while the host read the norm and dispatched ~150 small kernels
twice; on a CPU this measures the dispatch alone.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from types import SimpleNamespace

import torch


def per_parameter_clip(params: list[torch.Tensor], max_norm: float | None) -> float:
    """The clip as it was (plain tensors, one process): a norm per parameter, the total read to the host, then a
    ``mul_`` per parameter when it exceeds ``max_norm``."""
    norms = torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params if p.grad is not None])
    total = float(torch.linalg.vector_norm(norms))
    if max_norm is not None and math.isfinite(total) and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


def llama_like_parameters(layers: int, hidden: int, vocab: int = 1024) -> list[torch.nn.Parameter]:
    """Parameters shaped as a Llama's (9 per layer, embedding, final norm, head), with random gradients."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(vocab, hidden), (hidden,), (vocab, hidden)]
    for _ in range(layers):
        shapes += [(hidden,), (hidden, hidden), (hidden // 4, hidden), (hidden // 4, hidden), (hidden, hidden),
                   (hidden,), (4 * hidden, hidden), (4 * hidden, hidden), (hidden, 4 * hidden)]
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = torch.randn(shape, generator=gen)
        params.append(p)
    return params


def _time(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from runtime.parallel.grad_norm import clip_grad_norm_

    torch.set_num_threads(1)
    params = llama_like_parameters(args.layers, args.hidden)
    ctx = SimpleNamespace(device=torch.device("cpu"), pp_size=1)
    # a limit below the norm, so both clips scale every gradient; the gradients are restored before each call
    # (one _foreach_copy_, timed alone and taken off)
    saved = [p.grad.clone() for p in params]
    grads = [p.grad for p in params]
    max_norm = 0.5 * float(torch.linalg.vector_norm(torch.stack([g.norm() for g in saved])))

    def restore() -> None:
        torch._foreach_copy_(grads, saved)

    def old_clip() -> None:
        restore()
        per_parameter_clip(params, max_norm)

    def new_clip() -> None:
        restore()
        clip_grad_norm_(params, max_norm, ctx)

    best = {"restore": math.inf, "old": math.inf, "new": math.inf}
    for _ in range(args.rounds):  # interleaved rounds, best of each: other jobs' load moves all three alike
        for name, fn in (("restore", restore), ("old", old_clip), ("new", new_clip)):
            best[name] = min(best[name], _time(fn, args.repeats))
    old, new = best["old"] - best["restore"], best["new"] - best["restore"]
    print(json.dumps({"parameters": len(params), "per_parameter_ms": round(1000 * old, 3),
                      "foreach_ms": round(1000 * new, 3), "speedup": round(old / new, 2)}))


if __name__ == "__main__":
    main()
