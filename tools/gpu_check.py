"""The one-GPU check's parts, each in its own process with its own timeout (``tools/gpu_check.sh`` runs this).

    python tools/gpu_check.py            # every part, most important first; JSON lines; a summary line last
    python tools/gpu_check.py --plan     # the parts and their timeouts (no GPU needed)
    python tools/gpu_check.py --part attention_kernels

The timeouts add up to less than ``BUDGET_S`` (10 minutes with the set-up), so one lent GPU answers in one run
whatever hangs or compiles slowly: a part cut by its timeout is said (``"timed_out"``) and the next one runs.
Every line is a JSON object with a ``"part"``; the last line, ``{"part": "summary", ...}``, names the parts
that ran, failed or timed out. See docs/performance.md, "Reading gpu_check's output".
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BUDGET_S = 600  # the whole check, set-up (python, pip) included
SETUP_S = 40  # what gpu_check.sh may spend before this script (the pip step is capped at 25 s)
# (part, timeout in seconds), most important first: a slow machine loses the last ones
PARTS = [
    ("cuda_tests", 90),
    ("bench_compiled_document", 64),
    ("bench_compiled_causal", 50),
    ("bench_eager_causal", 35),
    ("bench_compiled_document_full_ac", 55),
    ("bench_llama32_1b_compiled_causal", 55),
    ("bench_qwen3_1_7b_compiled_causal", 50),
    ("attention_kernels", 45),
    ("cp_simulation", 40),
    ("bf16_vs_fp32", 35),
    ("pipeline_on_installed_torch", 40),
]
STEPS = 6  # timed steps per benchmark row (after 2 warm-up steps, which compile)


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


# ---------------------------------------------------------------------- the engine benchmark rows ----------

BENCH_ROWS = {
    # the ~1B proxy: hidden 2048 × 16 layers, GQA 32:8, vocab 32000, L 2048
    "bench_compiled_document": dict(compile=True, attention="document", checkpointing="none"),
    "bench_compiled_causal": dict(compile=True, attention="causal", checkpointing="none"),
    "bench_eager_causal": dict(compile=False, attention="causal", checkpointing="none"),
    "bench_compiled_document_full_ac": dict(compile=True, attention="document", checkpointing="full"),
    # Llama-3.2-1B's shape: intermediate 8192, vocab 128,256, tied embeddings
    "bench_llama32_1b_compiled_causal": dict(compile=True, attention="causal", checkpointing="none",
                                             intermediate=8192, vocab=128256, tied=True),
    # Qwen3-1.7B's shape: 28 layers, 16 query heads of 128 (not 2048 / 16), GQA 16:8, q/k norms per head,
    # intermediate 6144, vocab 151,936, tied; micro-batches of 2 (the same global batch)
    "bench_qwen3_1_7b_compiled_causal": dict(compile=True, attention="causal", checkpointing="none", family="qwen3",
                                             layers=28, heads=16, head_dim=128, intermediate=6144, vocab=151936,
                                             tied=True, micro_batch=2),
}


def bench_row(part: str) -> None:
    """One configuration of the ~1B benchmark in this fresh process: tokens/s and MFU of the steady steps,
    compile seconds (the warm-up steps' time beyond two steady steps), peak memory of this engine alone,
    recompiles, host syncs in the micro-batch loop, and the GPU's idle share of a step (a step's wall time
    against the kernel time of a one-step profiler trace)."""
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from bench_engine import batches, document_positions, make_config

    from runtime.engine import Engine
    from runtime.observe.metrics import flops_per_token, peak_flops
    from runtime.parallel.context import ParallelContext

    row = dict(BENCH_ROWS[part])
    mbs = row.get("micro_batch", 4)
    config = make_config(2048, row.get("layers", 16), 2048, mbs, 8 // mbs, STEPS, vocab=row.get("vocab", 32000),
                         intermediate=row.get("intermediate", 5632), kv_heads=8, attention=row["attention"])
    config.model.family = row.get("family", "llama")
    config.model.num_attention_heads = row.get("heads", config.model.num_attention_heads)
    config.model.head_dim = row.get("head_dim")
    config.model.compile = row["compile"]
    config.model.activation_checkpointing = row["checkpointing"]
    config.model.tie_word_embeddings = row.get("tied", False)
    ctx = ParallelContext()
    engine = Engine(config, ctx, initialize=False)
    with torch.no_grad():  # on the device: drawing 1B seeded weights on the CPU takes a minute
        for p in engine.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.ndim >= 2:
                local.normal_(0.0, 0.02)
            else:
                local.fill_(1.0)
    g = torch.Generator().manual_seed(1)
    data = batches(config, STEPS + 4)
    for step in data:
        for b in step:
            if row["attention"] == "document":
                b["position_ids"] = document_positions(*b["input_ids"].shape, g)
    data = [[{k: v.contiguous().pin_memory() for k, v in b.items()} for b in step] for step in data]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in data[:2]:
        engine.train_step(step)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    loop, sync = engine._run_accumulation, "none"

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return loop(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine._run_accumulation = checked
    try:
        engine.train_step(data[2])
    except RuntimeError as e:
        sync = str(e).splitlines()[0][:200]
    engine._run_accumulation = loop
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in data[3:3 + STEPS]:
        engine.train_step(step)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / STEPS
    idle = gpu_idle_share(lambda: engine.train_step(data[-1]))
    tps = config.global_batch_size * config.tokens.sequence_length / seconds
    peak = peak_flops(ctx.device)
    mfu = tps * flops_per_token(config.model, config.tokens.sequence_length) / peak if peak else None
    from torch._dynamo.utils import counters

    emit({"part": part, **row, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "params_b": round(sum(p.numel() for p in engine.parameters()) / 1e9, 3), "seq": 2048,
          "global_batch": config.global_batch_size, "step_ms": round(1000 * seconds, 1), "tokens_per_s": round(tps),
          "mfu": round(mfu, 4) if mfu is not None else None, "compile_s": round(max(warm - 2 * seconds, 0.0), 1),
          "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
          "recompiles": int(counters["stats"].get("unique_graphs", 0)), "gpu_idle_share": idle,
          "host_syncs_in_micro_batch_loop": sync})
    ctx.destroy()


def gpu_idle_share(step) -> float | None:
    """1 - (CUDA kernel time of one traced step) / (its wall time): the share of a step the GPU waits."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6  # µs → s (one stream: kernels do not overlap)
    return round(max(0.0, 1.0 - busy / wall), 3) if wall > 0 else None


# ---------------------------------------------------------------------- attention kernels alone ------------

def _timed(fn, repeats: int = 5) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def attention_kernels() -> None:
    """Forward + backward of one attention at the 1B proxy's heads (32 query, 8 key/value, head 64, batch 4):
    SDPA flash reading grouped K/V and with them repeated, cuDNN SDPA, compiled flex causal and by document;
    TFLOP/s of the unmasked work (4·L²·heads·head per batch row forward, × 3.5 with the backward, halved for
    causal masks: the same convention for every kernel)."""
    for length in (2048, 8192):
        attention_kernels_at(length)


def attention_kernels_at(length: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from runtime.models.document_attention import _flex, document_mask

    flex_attention, _ = _flex()
    g = torch.Generator(device="cuda").manual_seed(0)
    shape_q, shape_kv = (4, 32, length, 64), (4, 8, length, 64)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    work = 3.5 * 4 * length * length * 32 * 64 * 4 / 2  # causal: half of the unmasked score matrix
    pos = torch.cat([torch.arange(n) for n in [length // 8] * 8]).expand(4, -1).cuda()
    block_mask, causal_mask = document_mask(pos, 64), causal_block_mask(length)

    def sdpa(backend, grouped):
        def run():
            kk, vv = (k, v) if grouped else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=grouped).sum().backward()
        return run

    kernels = {"sdpa_flash_grouped_kv": sdpa(SDPBackend.FLASH_ATTENTION, True),
               "sdpa_flash_kv_copy": sdpa(SDPBackend.FLASH_ATTENTION, False),
               "sdpa_cudnn_kv_copy": sdpa(SDPBackend.CUDNN_ATTENTION, False),
               "flex_causal": lambda: flex_attention(q, k, v, block_mask=causal_mask, enable_gqa=True).sum().backward(),
               "flex_document": lambda: flex_attention(q, k, v, block_mask=block_mask,
                                                       enable_gqa=True).sum().backward()}
    for name, fn in kernels.items():
        try:
            seconds = _timed(fn)
            emit({"part": "attention_kernels", "kernel": name, "seq": length, "ms": round(1000 * seconds, 2),
                  "tflops_unmasked_causal_work": round(work / seconds / 1e12, 1)})
        except Exception as e:  # noqa: BLE001 - a kernel this GPU or torch lacks is a row, not the end
            emit({"part": "attention_kernels", "kernel": name, "seq": length, "error": f"{e}"[:300]})


def causal_block_mask(length: int):
    import torch

    from runtime.models.document_attention import sequence_mask

    pos = torch.arange(length, device="cuda")
    return sequence_mask(pos, pos, None, None, flex=True)


# ---------------------------------------------------------------------- context parallelism, simulated ------

def cp_simulation() -> None:
    """Each cp rank's attention (its head and tail chunks' queries against every key, flex with the run's block
    mask) timed on the one GPU at L 16k, cp 2 and 4, causal and document masks: per-rank ms and the slowest /
    fastest ratio (the load balance of head-tail chunks); and ``create_block_mask`` ms per micro-batch at L 2k
    and 32k (built once per micro-batch and chunk)."""
    import torch

    from runtime.models.document_attention import _flex, document_ids, sequence_mask
    from runtime.parallel.context_parallel import chunk_positions

    flex_attention, _ = _flex()
    length = 16384
    g = torch.Generator(device="cuda").manual_seed(0)
    pos_ids = torch.cat([torch.arange(n) for n in [1024] * (length // 1024)]).expand(1, -1).cuda()
    doc = document_ids(pos_ids)
    for cp in (2, 4):
        for mask in ("causal", "document"):
            times = []
            kv_pos = torch.cat([chunk_positions(length, cp, r, "cuda") for r in range(cp)])
            for rank in range(cp):
                q_pos = chunk_positions(length, cp, rank, "cuda")
                docs = (doc[:, q_pos], doc[:, kv_pos]) if mask == "document" else (None, None)
                block = sequence_mask(q_pos, kv_pos, *docs, flex=True)
                times.append(_flex_time(flex_attention, block, len(q_pos), length, g))
            emit({"part": "cp_simulation", "cp": cp, "mask": mask, "seq": length,
                  "per_rank_ms": [round(1000 * t, 2) for t in times], "slowest_over_fastest": round(max(times) /
                                                                                                    min(times), 3)})
    for length in (2048, 32768):
        pos_ids = torch.cat([torch.arange(n) for n in [512] * (length // 512)]).expand(4, -1).cuda()
        pos = torch.arange(length, device="cuda")
        seconds = _timed(functools.partial(sequence_mask, pos, pos, document_ids(pos_ids), document_ids(pos_ids),
                                           flex=True), repeats=5)
        emit({"part": "cp_simulation", "create_block_mask_ms": round(1000 * seconds, 2), "seq": length,
              "micro_batch_rows": 4})


def _flex_time(flex_attention, block, queries: int, keys: int, generator) -> float:
    """Seconds of one rank's flex attention forward and backward: ``queries`` against ``keys``."""
    import torch

    q = torch.randn(1, 32, queries, 64, device="cuda", dtype=torch.bfloat16, generator=generator, requires_grad=True)
    k = torch.randn(1, 8, keys, 64, device="cuda", dtype=torch.bfloat16, generator=generator, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    return _timed(lambda: flex_attention(q, k, v, block_mask=block, enable_gqa=True).sum().backward(), repeats=3)


# ---------------------------------------------------------------------- bf16 against fp32 --------------------

def bf16_vs_fp32() -> None:
    """20 steps of a small model (hidden 256 × 4 layers, L 512) on the same batches in bf16 (FSDP's mixed
    precision, fp32 master weights) and in fp32: both loss curves and their largest difference."""
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from bench_engine import batches, make_config

    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    ctx = ParallelContext()
    curves = {}
    for dtype in ("bfloat16", "float32"):
        config = make_config(256, 4, 512, 4, 2, 20)
        config.model.dtype = dtype
        torch.manual_seed(0)
        engine = Engine(config, ctx)
        curves[dtype] = [engine.train_step(step).loss for step in batches(config, 20)]
        del engine
        gc.collect()
    diff = max(abs(a - b) for a, b in zip(curves["bfloat16"], curves["float32"]))
    emit({"part": "bf16_vs_fp32", "steps": 20, "loss_bf16": [round(x, 4) for x in curves["bfloat16"]],
          "loss_fp32": [round(x, 4) for x in curves["float32"]], "max_abs_diff": round(diff, 4),
          "final_diff": round(curves["bfloat16"][-1] - curves["float32"][-1], 4)})
    ctx.destroy()


# ---------------------------------------------------------------------- the driver --------------------------

def cuda_tests() -> int:
    """The tests marked cuda (only the files that hold them: collecting others would import extras)."""
    files = sorted(str(p) for p in (ROOT / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text())
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:]
    emit({"part": "cuda_tests", "files": [str(Path(f).relative_to(ROOT)) for f in files], "returncode": proc.returncode,
          "result": tail[0] if tail else ""})
    if proc.returncode:
        print(proc.stdout[-4000:], proc.stderr[-2000:], file=sys.stderr)
    return proc.returncode  # 5 (nothing collected) is a failure here: the check tested nothing


def pipeline_on_installed_torch() -> int:
    """Pipeline parallelism (pp 2, afab and 1f1b; gloo on the CPU) on this machine's torch: the layout tests."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/runtime/test_engine.py", "-k", "pp2-afab or pp2-1f1b-4mb"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    tail = proc.stdout.strip().splitlines()[-1:]
    emit({"part": "pipeline_on_installed_torch", "returncode": proc.returncode, "result": tail[0] if tail else ""})
    return proc.returncode


def run_part(name: str) -> int:
    if name in BENCH_ROWS:
        bench_row(name)
        return 0
    result = {"cuda_tests": cuda_tests, "attention_kernels": attention_kernels, "cp_simulation": cp_simulation,
              "bf16_vs_fp32": bf16_vs_fp32, "pipeline_on_installed_torch": pipeline_on_installed_torch}[name]()
    return result or 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=[p for p, _ in PARTS])
    ap.add_argument("--plan", action="store_true", help="print the parts and their timeouts, run nothing")
    args = ap.parse_args()
    if args.part:
        return run_part(args.part)
    if args.plan:
        for name, timeout in PARTS:
            emit({"part": name, "timeout_s": timeout})
        emit({"part": "plan", "parts_s": sum(t for _, t in PARTS), "setup_s": SETUP_S, "budget_s": BUDGET_S})
        return 0
    ran, failed, timed_out = [], [], []
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name, timeout in PARTS:
        start = time.monotonic()
        # its own session: a part cut by its timeout is ended with everything it started (pytest's workers)
        proc = subprocess.Popen([sys.executable, __file__, "--part", name], cwd=ROOT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        seconds = round(time.monotonic() - start, 1)
        if code is None:
            timed_out.append(name)
            emit({"part": name, "timed_out": True, "timeout_s": timeout})
        elif code:
            failed.append(name)
            emit({"part": name, "failed": True, "returncode": code, "seconds": seconds})
        else:
            ran.append(name)
        emit({"part": name, "seconds": seconds})
    emit({"part": "summary", "ran": ran, "failed": failed, "timed_out": timed_out,
          "tests_ran": "cuda_tests" in ran})
    return 0 if not failed and "cuda_tests" in ran else 1


if __name__ == "__main__":
    sys.exit(main())
