# Settings and helpers shared by the scripts in scripts/tpu_vm/ (sourced, not run).
#
# Every setting is an environment variable with a default; export it once in
# your shell and every script sees the same TPU and run:
#
#   PROJECT           Google Cloud project (default: gcloud's configured one)
#   ZONE              a zone that offers ACCELERATOR_TYPE (europe-west4-b)
#   TPU_NAME          TPU VM (and queued resource) name (jaxgrpo)
#   ACCELERATOR_TYPE  v5litepod-8 (one host, 8 chips), v5litepod-32, v4-32, v6e-8, v5p-8, ...
#   RUNTIME_VERSION   TPU software version; default from ACCELERATOR_TYPE:
#                     v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5,
#                     v5e v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base
#   SPOT              1: a Spot TPU (cheaper, preemptible at any time) (0)
#   QUEUED            1: request it as a queued resource, which waits for
#                     capacity instead of failing (0)
#   VALID_UNTIL       with QUEUED=1: give up waiting after this long, e.g. 6h ('')
#   REPO_URL          git URL the workers clone (required by setup.sh)
#   BRANCH            branch the workers check out (main)
#   REPO_DIR          clone on each worker, relative to its home (jaxgrpo)
#   EXTRAS            pip extras installed with the package (hf,tensorboard)
#   PYTHON_VERSION    Python of the workers' virtual environment (3.12)
#   DATA_URI          optional gs:// folder copied to DATA_DIR on every worker ('')
#   DATA_DIR          where DATA_URI lands, relative to home or absolute (data)
#   RUN_NAME          run name, used in the default WORKDIR (TPU_NAME)
#   BUCKET            GCS bucket of the default WORKDIR
#   WORKDIR           run directory, gs://BUCKET/jaxgrpo/RUN_NAME by default;
#                     every worker of a pod slice writes its part of each
#                     checkpoint there
#   LOCAL_WORKDIR     one-host slices only: train into this local folder and
#                     mirror it to WORKDIR every SYNC_MINUTES (and at exit);
#                     a fresh VM first copies WORKDIR back ('')
#   SYNC_MINUTES      mirror interval with LOCAL_WORKDIR (10)
#   CONFIG            --config of the run (configs/demo.py)
#   ARGS              extra flags for every launch, e.g.
#                     '--config.mesh.fsdp=8 --config.model.remat=full' ('')
#   VENV, LOG_DIR, JAX_VERSION  on the workers; defaults in worker.sh

PROJECT=${PROJECT:-$(gcloud config get-value project 2>/dev/null || true)}
ZONE=${ZONE:-europe-west4-b}
TPU_NAME=${TPU_NAME:-jaxgrpo}
ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-v5litepod-8}
case "$ACCELERATOR_TYPE" in
  v6e-*) _runtime=v2-alpha-tpuv6e ;;
  v5p-*) _runtime=v2-alpha-tpuv5 ;;
  v5litepod-* | v5e-*) _runtime=v2-alpha-tpuv5-lite ;;
  *) _runtime=tpu-ubuntu2204-base ;;
esac
RUNTIME_VERSION=${RUNTIME_VERSION:-$_runtime}
SPOT=${SPOT:-0}
QUEUED=${QUEUED:-0}
VALID_UNTIL=${VALID_UNTIL:-}
REPO_URL=${REPO_URL:-}
BRANCH=${BRANCH:-main}
REPO_DIR=${REPO_DIR:-jaxgrpo}
EXTRAS=${EXTRAS:-hf,tensorboard}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
DATA_URI=${DATA_URI:-}
DATA_DIR=${DATA_DIR:-data}
RUN_NAME=${RUN_NAME:-$TPU_NAME}
BUCKET=${BUCKET:-}
WORKDIR=${WORKDIR:-${BUCKET:+gs://$BUCKET/jaxgrpo/$RUN_NAME}}
LOCAL_WORKDIR=${LOCAL_WORKDIR:-}
SYNC_MINUTES=${SYNC_MINUTES:-10}
CONFIG=${CONFIG:-configs/demo.py}
ARGS=${ARGS:-}

[[ $PROJECT != '(unset)' ]] || PROJECT=
: "${PROJECT:?set PROJECT (or run: gcloud config set project ID)}"
_where=(--zone="$ZONE" --project="$PROJECT")

# tpu_ssh WORKER [FLAGS...]: ssh into one worker (0, 1, ...) or all of them.
tpu_ssh() {
  local worker=$1
  shift
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${_where[@]}" \
    --worker="$worker" --strict-host-key-checking=no --quiet "$@"
}

# The TPU's state: READY, PREEMPTED, ... (for QUEUED=1 the queued resource's:
# ACTIVE, WAITING_FOR_RESOURCES, SUSPENDED, FAILED, ...); empty when it is gone.
tpu_state() {
  if [[ $QUEUED == 1 ]]; then
    gcloud compute tpus queued-resources describe "$TPU_NAME" "${_where[@]}" \
      --format='value(state.state)' 2>/dev/null || true
  else
    gcloud compute tpus tpu-vm describe "$TPU_NAME" "${_where[@]}" \
      --format='value(state)' 2>/dev/null || true
  fi
}

# Waits until the TPU can take ssh commands; fails on a state it won't leave.
wait_ready() {
  local state
  while true; do
    state=$(tpu_state)
    case "$state" in
      READY | ACTIVE) return 0 ;;
      '' | FAILED | SUSPENDED | PREEMPTED | TERMINATED)
        echo "TPU $TPU_NAME is '${state:-gone}'" >&2
        return 1
        ;;
    esac
    echo "TPU $TPU_NAME: $state; waiting" >&2
    sleep 30
  done
}

# ' word' for each argument, shell-quoted for the worker's shell (nothing for none).
quote_args() {
  if (($#)); then printf ' %q' "$@"; fi
}

# VAR=value words (shell-quoted) for the variables that are set, to pass the
# settings along to scripts/tpu_vm/worker.sh on the workers.
remote_env() {
  local name
  for name in "$@"; do
    [[ -n ${!name:-} ]] && printf '%s=%q ' "$name" "${!name}"
  done
  return 0
}

# The worker count of the slice (1 for a one-host slice).
num_workers() {
  gcloud compute tpus tpu-vm describe "$TPU_NAME" "${_where[@]}" --format=json |
    python3 -c 'import json, sys; print(len(json.load(sys.stdin)["networkEndpoints"]))'
}
