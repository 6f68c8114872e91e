#!/usr/bin/env bash
# Starts the same training command on every worker (after setup.sh), in the
# background with nohup; each worker logs to ~/jaxgrpo-logs/train-HOST.log on
# its own disk. Arguments (after ARGS) are passed on to jaxgrpo.main.
#
#   BUCKET=my-bucket CONFIG=configs/demo.py scripts/tpu_vm/train.sh
#   CONFIG=configs/qwen25_gsm8k.py:path=../data/Qwen2.5-0.5B-Instruct,gsm8k=../data/gsm8k \
#     scripts/tpu_vm/train.sh --config.mesh.fsdp=8
#
# The command runs in the clone (~/jaxgrpo), so relative paths in CONFIG start
# there; ../data is DATA_DIR. A pod slice runs jax.distributed.initialize()
# itself. Rerunning with the same WORKDIR resumes from its latest checkpoint.
# Follow worker 0's log:
#   gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --command='tail -f ~/jaxgrpo-logs/train-*.log'
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${WORKDIR:?set BUCKET (or WORKDIR=gs://...)}"

if [[ -n $LOCAL_WORKDIR ]] && (($(num_workers) > 1)); then
  echo "LOCAL_WORKDIR needs a one-host slice: the workers of a pod slice write" \
    "each checkpoint together, so WORKDIR must be gs://" >&2
  exit 1
fi
read -ra extra <<<"$ARGS"
cmd="cd $(printf %q "$REPO_DIR") && \
$(remote_env CONFIG WORKDIR LOCAL_WORKDIR SYNC_MINUTES VENV LOG_DIR)\
bash scripts/tpu_vm/worker.sh launch$(quote_args ${extra[@]+"${extra[@]}"} "$@")"
tpu_ssh all --command="$cmd"
echo "WORKDIR: $WORKDIR${LOCAL_WORKDIR:+ (mirrored from $LOCAL_WORKDIR on the worker)}"
