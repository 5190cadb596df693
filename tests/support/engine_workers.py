"""Processes for the engine tests: train a tiny Llama 3 steps on fixed batches in a given layout."""

from __future__ import annotations

import torch

from runtime.data.loading.contract import LABEL_KEYS
from runtime.parallel.tensor_pointer import TensorPointer
from tests.support.configs import tiny_config

GLOBAL_BATCH = 8
STEPS = 3


def global_batch(step: int) -> dict[str, torch.Tensor]:
    """Fixed data: tokens, position ids that restart mid-window, and some masked labels."""
    g = torch.Generator().manual_seed(100)  # the same batch every step: the loss must fall
    tokens = torch.randint(0, 128, (GLOBAL_BATCH, 17), generator=g)
    pos = torch.arange(17).repeat(GLOBAL_BATCH, 1)
    pos[::2, 9:] -= 9  # every other row: a new document starts at token 9
    mask = torch.rand(GLOBAL_BATCH, 16, generator=g) > 0.2
    return {"input_ids": tokens[:, :-1], "label_ids": tokens[:, 1:], "position_ids": pos[:, :-1],
            "input_mask": torch.ones(GLOBAL_BATCH, 16, dtype=torch.bool), "label_mask": mask}


class Untouchable(dict):
    """A middle pipeline rank's batch: reading any key is a test failure."""

    def __getitem__(self, key):
        raise AssertionError(f"a middle pipeline rank read {key!r}")


def rank_batches(step: int, ctx, accum: int, mbs: int = 2) -> list[dict]:
    """This rank's micro-batches: rows [m·dp·mbs + dp_rank·mbs, +mbs) of the global batch, per the contract."""
    full = global_batch(step)
    out = []
    for m in range(accum):
        start = m * ctx.dp_size * mbs + ctx.dp_rank * mbs
        b = {k: v[start : start + mbs] for k, v in full.items()}
        if ctx.pp_rank != 0:
            for k in ("input_ids", "input_mask", "position_ids"):
                b[k] = TensorPointer(0)
        if ctx.pp_rank != ctx.pp_size - 1:
            for k in LABEL_KEYS:
                b[k] = TensorPointer(ctx.pp_size - 1)
        out.append(b if ctx.pp_rank in (0, ctx.pp_size - 1) else Untouchable(b))
    return out


def train_and_dump(rank: int, world: int, layout: dict, out_path: str) -> None:
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = tiny_config(**layout)
    p = config.parallelism
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
    engine = Engine(config, ctx)
    first_grads: dict[str, torch.Tensor] = {}
    optimizer_step = engine.optimizer.step

    def step_keeping_first_gradients(*args, **kwargs):
        if not first_grads:  # the gradients of step 1, clipped, before any optimizer step
            first_grads.update(_full(engine, lambda p: p.grad))
        return optimizer_step(*args, **kwargs)

    engine.optimizer.step = step_keeping_first_gradients
    losses = [engine.train_step(rank_batches(s, ctx, config.tokens.batch_accumulation_per_replica)).loss
              for s in range(STEPS)]
    weights = _full(engine, lambda p: p)
    if ctx.dp_rank == 0 and ctx.tp_rank == 0 and ctx.cp_rank == 0:  # one writer per pipeline rank's file
        torch.save({"losses": losses, "weights": weights, "grads": first_grads}, f"{out_path}.pp{ctx.pp_rank}")


def _full(engine, part) -> dict[str, torch.Tensor]:
    """``part(parameter)`` of every parameter as one whole tensor (gathered from its shards), by name."""
    out = {}
    for name, param in engine.named_parameters():
        t = part(param)
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
    return out


def build_expecting_error(rank: int, world: int, layout: dict, fragment: str) -> None:
    """Building the context/engine for ``layout`` on ``world`` processes must fail with ``fragment``."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    try:
        config = tiny_config(**layout)
        p = config.parallelism
        Engine(config, ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp))
    except ValueError as e:
        assert fragment in str(e), str(e)
        return
    raise AssertionError(f"no error for {layout} on {world} processes")


def bf16_and_host_copies(rank: int, world: int) -> None:
    """dtype bfloat16 on CPU with dp = 1 computes in bf16, and the loader's tensors reach the device
    as they are (no host-side cat/where, which would turn pinned memory into pageable copies)."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = tiny_config(dtype="bfloat16")
    engine = Engine(config, ParallelContext())
    seen: list[torch.dtype] = []
    engine.chunks[0].layers["0"].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    copied: list[int] = []
    to_device = engine._to_device
    engine._to_device = lambda t: copied.append(t.data_ptr()) or to_device(t)
    batches = rank_batches(0, engine.ctx, 4)
    loss = engine.train_step(batches).loss
    assert set(seen) == {torch.bfloat16}, seen
    expected = [b[k].data_ptr() for k in ("label_mask", "label_ids") for b in batches[:1]]
    assert copied[:2] == expected and len(copied) == 4 * 4, copied  # 4 micro-batches × 4 tensors, each as it is
    assert abs(loss - torch.log(torch.tensor(128.0)).item()) < 0.2


def schedule_per_length(rank: int, world: int) -> None:
    """pp = 2: a new sequence length gets a new schedule and the previous one is freed; and a
    pipeline step raises no warning from the engine."""
    import warnings

    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = tiny_config(pp=2, engine="1f1b")
    engine = Engine(config, ParallelContext(pp=2))
    for length in (16, 8, 16):
        batches = [{k: v if isinstance(v, TensorPointer) else v[:, :length] for k, v in b.items()}
                   for b in rank_batches(0, engine.ctx, 4)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.train_step(batches, length)
        assert [str(w.message) for w in caught if w.filename.endswith("engine.py")] == []
        assert list(engine._schedules) == [(length,)], list(engine._schedules)


def construction_memory(rank: int, world: int, layout: dict, out_path: str) -> None:
    """Peak resident memory added by building the engine, and the model's full size, in bytes."""
    import resource

    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = tiny_config(hidden_size=256, intermediate_size=16384, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=4, **layout)
    p = config.parallelism
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
    page = resource.getpagesize()
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * page
    with open("/proc/self/clear_refs", "w") as f:  # the peak from here on, not one of start-up's imports
        f.write("5")
    engine = Engine(config, ctx)
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    full = sum(p.numel() for p in engine.parameters()) * 4  # numel of a DTensor: the full tensor's
    torch.save({"added": peak - before, "full": full}, f"{out_path}.{rank}")
