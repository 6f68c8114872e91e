#!/usr/bin/env bash
# Runs on a TPU VM worker, from the repository clone; the other scripts in
# scripts/tpu_vm/ call it over ssh on every worker (or worker 0):
#
#   worker.sh setup             Python venv, jax[tpu], this package, DATA_URI
#   worker.sh launch [FLAGS]    start the training command in the background
#   worker.sh status            exit 0 when a run is going
#   worker.sh stop              SIGTERM the run and wait until it has saved
#   worker.sh tensorboard PORT  start TensorBoard on WORKDIR in the background
#
# Settings arrive as environment variables (described in env.sh); the paths
# below are on the worker. The training command's working directory is the
# clone, so relative paths in CONFIG are relative to it.
set -euo pipefail

VENV=${VENV:-$HOME/venv-jaxgrpo}
LOG_DIR=${LOG_DIR:-$HOME/jaxgrpo-logs}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
JAX_VERSION=${JAX_VERSION:-}
EXTRAS=${EXTRAS:-hf,tensorboard}
DATA_URI=${DATA_URI:-}
DATA_DIR=${DATA_DIR:-data}
CONFIG=${CONFIG:-configs/demo.py}
WORKDIR=${WORKDIR:-}
LOCAL_WORKDIR=${LOCAL_WORKDIR:-}
SYNC_MINUTES=${SYNC_MINUTES:-10}

self=$(cd "$(dirname "$0")" && pwd)/worker.sh
cd "$(dirname "$self")/../.."
pidfile=$LOG_DIR/train.pid

running() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

setup() {
  # TPU VM images ship Ubuntu's Python 3.10 and jax >= 0.7 needs 3.11 or
  # newer: uv finds (or downloads) PYTHON_VERSION for the virtual environment.
  if [[ ! -x $VENV/bin/python ]]; then
    python3 -m pip install --user --quiet uv ||
      curl -LsSf https://astral.sh/uv/install.sh | sh
    "$HOME/.local/bin/uv" venv --seed --python "$PYTHON_VERSION" "$VENV"
  fi
  local py=$VENV/bin/python
  "$py" -m pip install --quiet --upgrade pip
  "$py" -m pip install --quiet --upgrade "jax[tpu]${JAX_VERSION:+==$JAX_VERSION}"
  "$py" -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
  if [[ -n $DATA_URI ]]; then
    [[ $DATA_DIR == /* ]] || DATA_DIR=$HOME/$DATA_DIR
    mkdir -p "$DATA_DIR"
    gcloud storage rsync --recursive "$DATA_URI" "$DATA_DIR"
  fi
  echo "$(hostname): commit $(git rev-parse --short HEAD)," \
    "$("$py" -c 'import jax; print("jax", jax.__version__, "with", jax.local_device_count(), "local devices")')"
}

launch() {
  : "${WORKDIR:?WORKDIR is not set}"
  mkdir -p "$LOG_DIR"
  if running; then
    echo "$(hostname): a run is already going (pid $(cat "$pidfile"))" >&2
    return 1
  fi
  # A fresh VM with LOCAL_WORKDIR: bring back what the last one mirrored.
  if [[ -n $LOCAL_WORKDIR && ! -d $LOCAL_WORKDIR/checkpoints ]] &&
    gcloud storage ls "$WORKDIR/checkpoints" >/dev/null 2>&1; then
    echo "$(hostname): copying $WORKDIR to $LOCAL_WORKDIR"
    mkdir -p "$LOCAL_WORKDIR"
    gcloud storage rsync --recursive "$WORKDIR" "$LOCAL_WORKDIR"
  fi
  local log
  log=$LOG_DIR/train-$(hostname).log
  # setsid + nohup: the run outlives this ssh session.
  setsid nohup bash "$self" run "$@" >>"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  echo "$(hostname): started pid $!, log $log"
}

run() {
  local py=("$VENV/bin/python" -m jaxgrpo.main --config="$CONFIG")
  echo "$(date -u +%FT%TZ) $(hostname) commit $(git rev-parse --short HEAD):" \
    "${py[*]} --workdir=${LOCAL_WORKDIR:-$WORKDIR} $*"
  if [[ -z $LOCAL_WORKDIR ]]; then
    exec "${py[@]}" --workdir="$WORKDIR" "$@"
  fi
  mirror() {
    # Orbax saves into *.orbax-checkpoint-tmp-* and renames when complete:
    # leave those out. Nothing is deleted in the bucket.
    gcloud storage rsync --recursive --exclude='.*orbax-checkpoint-tmp.*' \
      "$LOCAL_WORKDIR" "$WORKDIR" >/dev/null ||
      echo "mirror to $WORKDIR failed; retrying at the next one" >&2
  }
  (while sleep "$((SYNC_MINUTES * 60))"; do mirror; done) &
  local syncer=$! trainer rc=0
  "${py[@]}" --workdir="$LOCAL_WORKDIR" "$@" &
  trainer=$!
  trap 'kill -TERM "$trainer" 2>/dev/null || true' TERM INT
  # A signal ends `wait` early: wait again until the run has saved and exited.
  while kill -0 "$trainer" 2>/dev/null; do
    rc=0
    wait "$trainer" || rc=$?
  done
  kill "$syncer" 2>/dev/null || true
  mirror
  exit "$rc"
}

stop() {
  if ! running; then
    echo "$(hostname): no run going"
    return 0
  fi
  local pid waited=0
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  # SIGTERM: the run finishes its step, saves a checkpoint and exits.
  while kill -0 "$pid" 2>/dev/null && ((waited < 900)); do
    sleep 5
    waited=$((waited + 5))
  done
  echo "$(hostname): stopped"
}

start_tensorboard() {
  local port=${1:-6006} tb_pid=$LOG_DIR/tensorboard.pid
  mkdir -p "$LOG_DIR"
  if [[ -f $tb_pid ]] && kill -0 "$(cat "$tb_pid")" 2>/dev/null; then
    return 0
  fi
  setsid nohup "$VENV/bin/tensorboard" --logdir="${LOCAL_WORKDIR:-$WORKDIR}" \
    --port="$port" >"$LOG_DIR/tensorboard.log" 2>&1 </dev/null &
  echo $! >"$tb_pid"
}

command=${1:-}
shift || true
case "$command" in
  setup) setup ;;
  launch) launch "$@" ;;
  run) run "$@" ;;
  status) running ;;
  stop) stop ;;
  tensorboard) start_tensorboard "$@" ;;
  *)
    sed -n '2,12p' "$self" >&2
    exit 2
    ;;
esac
