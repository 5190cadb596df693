#!/usr/bin/env bash
# The main job on the bundled fixtures: tokenize three datasets, then train a tiny Llama for two
# stages (pretrain blend -> anneal at a shorter sequence length) on 2 CPU processes, and export it to
# Hugging Face (generating a few tokens with transformers when it is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for name in web code sft; do
  "$BIN/nanoset" tokenize "data_fixtures/corpus/$name" -o "shards/$name" --tokenizer data_fixtures/tokenizer --quiet
done
"$BIN/nanoset" inspect shards/sft --samples 1
rm -rf runs/two-stage  # a fresh demo run every time (see README: resume)
"$BIN/torchrun" --nproc_per_node=2 runtime/train.py --config data_fixtures/configs/two-stage.yaml
# the final checkpoint as a Hugging Face folder; transformers (when installed) loads it and continues a prompt
"$BIN/python" -m runtime.export runs/two-stage/checkpoints runs/two-stage/hf
"$BIN/python" tools/hf_generate.py runs/two-stage/hf "The history of"
