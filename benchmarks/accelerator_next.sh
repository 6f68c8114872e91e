#!/usr/bin/env bash
# The next accelerator run, prepared as one script of about 8 minutes on one
# H200 (see BENCHMARKS.md, "On an accelerator"). It measures what the last
# run named as the next fixes for the two goals of the rollout engine:
#
#   1. the GRPO train step of the Qwen2.5-0.5B shape (bf16) with its passes'
#      attention as the einsum form and as cuDNN's fused kernel
#      (attention.MULTI_TOKEN_ATTENTION), at 128 rows; and last, 256 rows
#      with cuDNN attention and remat 'full', which ran out of memory
#      without remat before the logits came in chunks;
#   2. decode at 64 and 256 slots with XLA's default command buffers, and
#      with the decode loop's while and conditional ops captured as CUDA
#      graphs too (the last trace had the device idle 36% of a decode,
#      between the kernels of each step); then at 256 slots reading only
#      the live part of the cache (attention.DECODE_LIVE_BUCKETS = 8, on
#      by default on the CPU only: a conditional per layer and step).
#
#   bash benchmarks/accelerator_next.sh OUT_DIR     # on the device machine
#
# Each command is limited on its own (`timeout`), so that one that hangs or
# runs out of memory leaves the others measured; each writes its JSON to
# OUT_DIR, and the console log goes to OUT_DIR/log.txt.
set -u
out=${1:?usage: accelerator_next.sh OUT_DIR}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
graphs='--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE'

run() {  # seconds, then the arguments of accelerator.py
  local limit=$1
  shift
  echo "== $* (at most ${limit}s)"
  timeout "$limit" "$py" benchmarks/accelerator.py "$@"
  echo "== exit $?"
}

# Limits from the last run's times: a train-step variant compiled in 38-59 s
# and a decode size in about 10 s. Together they are 470 s.
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  run 150 --parts ceilings,train --rows 128 --repeats 3 --cotangents compute \
    --attention einsum,cudnn --json "$out/train128.json"
  run 80 --parts decode --slots 64,256 --forms einsum \
    --json "$out/decode.json"
  XLA_FLAGS="$graphs" run 80 --parts decode --slots 64,256 --forms einsum \
    --json "$out/decode_graphs.json"
  run 60 --parts decode --slots 256 --forms einsum --decode-live-buckets 8 \
    --json "$out/decode_live.json"
  run 100 --parts train --rows 256 --repeats 2 --cotangents compute \
    --attention cudnn --remat full --json "$out/train256.json"
} 2>&1 | tee "$out/log.txt"
