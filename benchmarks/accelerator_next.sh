#!/usr/bin/env bash
# The next accelerator run, prepared as one script of at most 8 minutes on
# one H100 or H200 (see BENCHMARKS.md, "On an accelerator"). In order of
# what it decides:
#
#   1. a GRPO step with dynamic sampling, streaming vs rounds (the rollout
#      engine's 1.5x bar, not met on the CPU, where a decode step's time
#      grows with its rows): Qwen2.5-0.5B's shape in bf16 with its own
#      vocabulary, B = 8 groups of G = 8, 64 slots, GSM8K completion
#      lengths up to 512 and the stand-in verifier of the CPU runs (about
#      30% of groups informative); rounds and streaming (discarding and
#      keeping the groups in flight) on the continuous engine, steps
#      interleaved, the train batch padded to 512 (one compilation)
#      and its blocks recomputed but for their matmuls (remat 'dots', so
#      that 64 rows of 640 tokens fit an H100's 80 GB too);
#   2. the GRPO train step of the same shape with its passes' attention as
#      the einsum form and as cuDNN's fused kernel
#      (attention.MULTI_TOKEN_ATTENTION), at 128 rows.
#
# Left for a longer lease (BENCHMARKS.md): decode with the loop captured as
# CUDA graphs, decode reading the live cache, 256 train rows.
#
# Set up here (the device reaches neither ../shared nor the internet):
#
#   mkdir -p .devcarry && cp ../shared/data/gsm8k/train.jsonl .devcarry/gsm8k_train.jsonl
#
# then run, carrying .devcarry (ignored by git):
#
#   bash benchmarks/accelerator_next.sh OUT_DIR     # on the device machine
#
# Each command is limited on its own (`timeout`), so that one that hangs or
# runs out of memory leaves the others measured; each writes its JSON to
# OUT_DIR (the GRPO step's after every step), and the console log goes to
# OUT_DIR/log.txt.
set -u
out=${1:?usage: accelerator_next.sh OUT_DIR}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

run() {  # seconds, then the arguments of accelerator.py
  local limit=$1
  shift
  echo "== accelerator.py $* (at most ${limit}s)"
  timeout "$limit" "$py" benchmarks/accelerator.py "$@"
  echo "== exit $?"
}

grpo() {  # seconds, then the arguments of grpo_step.py
  local limit=$1
  shift
  echo "== grpo_step.py $* (at most ${limit}s)"
  PYTHONPATH=. timeout "$limit" "$py" benchmarks/grpo_step.py "$@"
  echo "== exit $?"
}

# Limits: a train-step variant of this shape compiled in 38-59 s on the last
# H200 run; the GRPO step's modes share one train step and the engine's
# programs, compiled once before its 10 timed steps of each mode (about 2 s
# a step by the decode steps counted on the CPU). Together they are 450 s.
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  grpo 300 --model qwen2.5_0.5b --dtype bfloat16 --model-vocab \
    --batch 8 --group 8 --slots 64 --round-size 8 --chunk 16 \
    --max-new 512 --prompt-width 128 --steps 10 --train-lengths 1 --remat dots \
    --verify-workers 0 --modes rounds,streaming,streaming_keep \
    --lengths benchmarks/data/gsm8k_lengths.json \
    --gsm8k .devcarry/gsm8k_train.jsonl --json "$out/grpo_step.json"
  run 150 --parts ceilings,train --rows 128 --repeats 3 --cotangents compute \
    --attention einsum,cudnn --json "$out/train128.json"
} 2>&1 | tee "$out/log.txt"
