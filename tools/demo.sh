#!/usr/bin/env bash
# The main job on the bundled fixtures: tokenize three datasets, then train a tiny Llama for two
# stages (pretrain blend -> anneal at a shorter sequence length) on 2 CPU processes.
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
