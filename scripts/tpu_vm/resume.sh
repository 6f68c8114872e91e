#!/usr/bin/env bash
# Brings a preempted run back: recreates the TPU if it is gone or preempted,
# reruns setup.sh and train.sh with the same settings and arguments; the run
# resumes from the latest checkpoint in WORKDIR. Does nothing while the run is
# still going, so it can be polled:
#
#   scripts/tpu_vm/resume.sh --config.mesh.fsdp=8     # same arguments as train.sh
#   while true; do scripts/tpu_vm/resume.sh; sleep 600; done
set -euo pipefail
here=$(dirname "$0")
source "$here/env.sh"

state=$(tpu_state)
case "$state" in
  READY | ACTIVE)
    if tpu_ssh 0 --command="cd $(printf %q "$REPO_DIR") && \
$(remote_env LOG_DIR)bash scripts/tpu_vm/worker.sh status" >/dev/null 2>&1; then
      echo "TPU $TPU_NAME is up and the run is going"
      exit 0
    fi
    ;;
  '') "$here/create.sh" ;;
  CREATING | ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | STARTING | RESTARTING | REPAIRING)
    wait_ready
    ;;
  *)
    echo "TPU $TPU_NAME is $state: deleting and recreating it"
    "$here/delete.sh"
    "$here/create.sh"
    ;;
esac
"$here/setup.sh"
"$here/train.sh" "$@"
