#!/usr/bin/env bash
# Creates the TPU VM (one host) or pod slice (several hosts) and waits until it
# is ready. Settings: env.sh. Examples:
#
#   PROJECT=my-project ZONE=europe-west4-b ACCELERATOR_TYPE=v5litepod-8 \
#     BUCKET=my-bucket scripts/tpu_vm/create.sh
#   SPOT=1 scripts/tpu_vm/create.sh                # Spot: cheaper, preemptible
#   QUEUED=1 SPOT=1 VALID_UNTIL=6h scripts/tpu_vm/create.sh
#                                                  # queued resource: waits for capacity
#
# With WORKDIR (or BUCKET) set, a missing bucket is created in the TPU's region.
set -euo pipefail
source "$(dirname "$0")/env.sh"

if [[ $QUEUED == 1 ]]; then
  flags=(--node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE"
    --runtime-version="$RUNTIME_VERSION")
  if [[ $SPOT == 1 ]]; then flags+=(--spot); fi
  if [[ -n $VALID_UNTIL ]]; then flags+=(--valid-until-duration="$VALID_UNTIL"); fi
  gcloud compute tpus queued-resources create "$TPU_NAME" "${_where[@]}" "${flags[@]}"
else
  flags=(--accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
  if [[ $SPOT == 1 ]]; then flags+=(--spot); fi
  gcloud compute tpus tpu-vm create "$TPU_NAME" "${_where[@]}" "${flags[@]}"
fi
wait_ready

if [[ $WORKDIR == gs://* ]]; then
  bucket=${WORKDIR#gs://}
  bucket=gs://${bucket%%/*}
  if ! gcloud storage buckets describe "$bucket" --project="$PROJECT" >/dev/null 2>&1; then
    gcloud storage buckets create "$bucket" --project="$PROJECT" --location="${ZONE%-*}"
  fi
fi
echo "TPU $TPU_NAME ($ACCELERATOR_TYPE, $RUNTIME_VERSION) is ready; next: scripts/tpu_vm/setup.sh"
