"""Load an exported Hugging Face folder with transformers and continue a prompt greedily — the check
that the export works outside this project: ``python tools/hf_generate.py OUT [PROMPT] [--tokens N]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a folder written by python -m runtime.export")
    ap.add_argument("prompt", nargs="?", default="The history of")
    ap.add_argument("--tokens", type=int, default=12, help="new tokens to generate (greedy)")
    args = ap.parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        print("transformers is not installed: the export is not loaded here (pip install transformers to try it)")
        return 0
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    model = AutoModelForCausalLM.from_pretrained(args.folder)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    print(f"transformers loaded {args.folder}: {args.prompt!r} → {tokenizer.decode(out[0, ids.shape[1]:])!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
