#!/usr/bin/env bash
# The main job on the bundled fixtures: tokenize three datasets and a chat folder, train a tiny Llama
# for three stages (pretrain blend -> anneal at a shorter sequence length -> SFT on whole conversations
# with document-masked attention, trained on the answers only) on 2 CPU processes, and export it to
# Hugging Face (generating a few tokens with transformers when it is installed); then print the run's summary
# (`nanoset metrics`) and draw its curves (runs/three-stage/metrics.png; matplotlib: the plot extra).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for name in web code sft; do
  "$BIN/nanoset" tokenize "data_fixtures/corpus/$name" -o "shards/$name" --tokenizer data_fixtures/tokenizer --quiet
done
"$BIN/nanoset" tokenize data_fixtures/chat -o shards/chat --tokenizer data_fixtures/tokenizer --chat --quiet
"$BIN/nanoset" inspect shards/chat --samples 1
rm -rf runs/three-stage  # a fresh demo run every time (see docs/checkpoints.md: resuming)
"$BIN/nanoset" train --config data_fixtures/configs/three-stage.yaml
# from metrics.jsonl: the blend stage's loss and mix per source, and what the SFT stage trained on (label_tokens
# of its steps: answers only, whole conversations)
"$BIN/python" - runs/three-stage/metrics.jsonl <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "label_tokens" in r]
blend = [r for r in rows if r["stage"] == "pretrain"]
for first, last in ((1, 5), (26, 30)):
    part = [r for r in blend if first <= r["step"] <= last]
    total = sum(s["samples"] for r in part for s in r["sources"].values())
    per = []
    for name in part[0]["sources"]:
        mine = [r["sources"][name] for r in part]
        tokens = sum(s["label_tokens"] for s in mine)
        loss = sum(s["loss"] * s["label_tokens"] for s in mine if s["loss"] is not None) / max(tokens, 1)
        per.append(f"{name} loss {loss:.3f} ({sum(s['samples'] for s in mine) / total:.0%} of samples)")
    print(f"stage 'pretrain', steps {first}-{last}, per source: " + ", ".join(per))
sft = [r for r in rows if r["stage"] == "sft"]
print(f"SFT stage 'sft': {sum(r['label_tokens'] for r in sft):,} label tokens trained on in {len(sft)} steps "
      f"(assistant answers only; prompts, template scaffolding and padding masked)")
PY
# the final checkpoint as a Hugging Face folder; transformers (when installed) loads it and continues a prompt
"$BIN/python" -m runtime.export runs/three-stage/checkpoints runs/three-stage/hf
"$BIN/python" tools/hf_generate.py runs/three-stage/hf "The history of"
# the run's summary from its metrics.jsonl, and its curves (loss, per-source and validation loss, learning rate)
"$BIN/nanoset" metrics runs/three-stage --plot runs/three-stage/metrics.png
