#!/usr/bin/env bash
# Starts TensorBoard on worker 0 (reading WORKDIR, or LOCAL_WORKDIR when set)
# and forwards it to http://localhost:PORT until Ctrl-C. Needs the
# `tensorboard` extra (in EXTRAS by default).
#
#   PORT=6006 scripts/tpu_vm/tensorboard.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${WORKDIR:?set BUCKET (or WORKDIR=gs://...)}"
PORT=${PORT:-6006}

tpu_ssh 0 --command="cd $(printf %q "$REPO_DIR") && \
$(remote_env WORKDIR LOCAL_WORKDIR VENV LOG_DIR)bash scripts/tpu_vm/worker.sh tensorboard $PORT"
echo "TensorBoard on http://localhost:$PORT (Ctrl-C closes the tunnel)"
tpu_ssh 0 -- -N -L "$PORT:localhost:$PORT"
