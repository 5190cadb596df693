"""Per-step logging: one line on the console, one JSON object per step in ``run_dir/metrics.jsonl``,
TensorBoard events when the package is installed. Global rank 0 writes; others stay quiet."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

# dense bf16 peak FLOP/s by device name fragment, for MFU
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def flops_per_token(model_args, sequence_length: int) -> float:
    """Training FLOPs per token: 6 · parameters (matmuls) + attention scores, forward and backward."""
    h, n, v = model_args.hidden_size, model_args.num_hidden_layers, model_args.vocab_size
    kv = model_args.kv_heads * (h // model_args.num_attention_heads)
    params = n * (2 * h * h + 2 * h * kv + 3 * h * model_args.intermediate_size) + h * v
    return 6 * params + 12 * n * h * sequence_length


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, log_interval: int = 1) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.log_interval = log_interval
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:
                self.tb = None

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (a killed run may have logged them)."""
        if not self.enabled or not self.path.is_file():
            return
        keep = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, self.path)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tb.add_scalar(key, value, record["step"])
        if record["step"] % self.log_interval == 0:
            mfu = f" | mfu {100 * record['mfu']:.1f}%" if record.get("mfu") is not None else ""
            self.info(f"step {record['step']:>6} | {record['stage']} | loss {record['loss']:.4f} | lr {record['lr']:.3e} "
                      f"| grad_norm {record['grad_norm']:.3f} | tokens/s {record['tokens_per_s']:,.0f} "
                      f"| data_wait {record['data_wait_ms']:.1f} ms{mfu}")

    def info(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stdout, flush=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
