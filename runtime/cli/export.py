"""Export: ``python -m runtime.export CHECKPOINT OUT [--dtype bfloat16|float32] [--tokenizer DIR]``.

Writes a folder that ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` loads as-is
(config.json, safetensors, generation_config.json, the tokenizer files of the data the checkpoint's
stage trained on, with its chat template, or those of ``--tokenizer DIR``), from a checkpoint of any
tp/pp/dp layout, on one CPU process. Mistakes are one line and exit status 1.
"""

from __future__ import annotations

import argparse
import json

from nanoset.errors import report_user_errors
from runtime.hf.export import DTYPES, export_checkpoint


def main(argv: list[str] | None = None, prog: str = "python -m runtime.export") -> int:
    """``prog``: the name usage lines give the command (``nanoset export`` runs this too)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="a step-N checkpoint folder, or a checkpoints folder (its latest)")
    ap.add_argument("out", help="the Hugging Face folder to write (must not exist)")
    ap.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: the checkpoint's (float32)")
    ap.add_argument("--tokenizer", metavar="DIR", default=None,
                    help="a tokenizer folder to carry instead of the data's (default: that of the checkpoint's stage)")
    args = ap.parse_args(argv)
    return report_user_errors(lambda: export(args.checkpoint, args.out, args.dtype, args.tokenizer))


def export(checkpoint: str, out: str, dtype: str | None, tokenizer: str | None = None) -> int:
    written = export_checkpoint(checkpoint, out, dtype, tokenizer=tokenizer)
    note = json.loads((written / "nanoset_export.json").read_text())["tokenizer"]
    print(f"exported {checkpoint} to {written} ({note})")
    return 0

