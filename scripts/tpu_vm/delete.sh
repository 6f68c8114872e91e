#!/usr/bin/env bash
# Stops the run (SIGTERM: it saves a checkpoint) and deletes the TPU VM or the
# queued resource. WORKDIR in the bucket is kept.
#
#   scripts/tpu_vm/delete.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"

case "$(tpu_state)" in
  READY | ACTIVE)
    tpu_ssh all --command="cd $(printf %q "$REPO_DIR") && \
$(remote_env LOG_DIR)bash scripts/tpu_vm/worker.sh stop" || true
    ;;
esac
if [[ $QUEUED == 1 ]]; then
  gcloud compute tpus queued-resources delete "$TPU_NAME" "${_where[@]}" --force --quiet
else
  gcloud compute tpus tpu-vm delete "$TPU_NAME" "${_where[@]}" --quiet
fi
