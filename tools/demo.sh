#!/usr/bin/env bash
# The main job on the bundled fixtures: tokenize three datasets and a chat folder, train a tiny Llama
# for three stages (pretrain blend -> anneal at a shorter sequence length -> SFT on whole conversations
# with document-masked attention, trained on the answers only) on 2 CPU processes, and export it to
# Hugging Face (generating a few tokens with transformers when it is installed).
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
# what the SFT stage trained on: label_tokens of its steps in metrics.jsonl (answers only, whole conversations)
"$BIN/python" - runs/three-stage/metrics.jsonl <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("stage") == "sft" and "label_tokens" in r]
print(f"SFT stage 'sft': {sum(r['label_tokens'] for r in rows):,} label tokens trained on in {len(rows)} steps "
      f"(assistant answers only; prompts, template scaffolding and padding masked)")
PY
# the final checkpoint as a Hugging Face folder; transformers (when installed) loads it and continues a prompt
"$BIN/python" -m runtime.export runs/three-stage/checkpoints runs/three-stage/hf
"$BIN/python" tools/hf_generate.py runs/three-stage/hf "The history of"
