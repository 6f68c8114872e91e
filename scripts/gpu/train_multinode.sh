#!/usr/bin/env bash
# Trains on N GPU nodes without a cluster manager: run this on every node with
# the same settings and its own NODE_RANK (0 .. NUM_NODES-1). Each node drives
# all of its GPUs from one process; node 0 hosts the coordinator.
#
#   # once per node: pip install 'jax[cuda12]' && pip install -e '.[hf]'
#   # node 0 (10.0.0.1), then node 1:
#   COORDINATOR=10.0.0.1:12345 NUM_NODES=2 NODE_RANK=0 WORKDIR=/shared/runs/qwen \
#     CONFIG=configs/qwen25_gsm8k.py:path=/data/qwen,gsm8k=/data/gsm8k \
#     scripts/gpu/train_multinode.sh --config.mesh.fsdp=8
#   COORDINATOR=10.0.0.1:12345 NUM_NODES=2 NODE_RANK=1 ... (the same)
#
# Settings (environment variables):
#   COORDINATOR  HOST:PORT of node 0, reachable from every node (required when
#                NUM_NODES > 1; any free port)
#   NUM_NODES    number of nodes (1)
#   NODE_RANK    this node's rank, 0 on the coordinator's node (0)
#   CONFIG       --config (configs/demo.py)
#   WORKDIR      run directory that every node can write: a shared file system
#                or gs://; each node writes its part of every checkpoint
#   PYTHON       interpreter with jaxgrpo installed (python3)
#   ARGS         extra flags, e.g. '--config.mesh.fsdp=8' ('')
# Arguments are passed on to jaxgrpo.main. The same command resumes from the
# latest checkpoint in WORKDIR; SIGTERM makes the run save and stop.
set -euo pipefail

COORDINATOR=${COORDINATOR:-}
NUM_NODES=${NUM_NODES:-1}
NODE_RANK=${NODE_RANK:-0}
CONFIG=${CONFIG:-configs/demo.py}
WORKDIR=${WORKDIR:?set WORKDIR (a folder every node can write)}
PYTHON=${PYTHON:-python3}
ARGS=${ARGS:-}

cd "$(dirname "$0")/../.."
cmd=("$PYTHON" -m jaxgrpo.main --config="$CONFIG" --workdir="$WORKDIR")
if ((NUM_NODES > 1)); then
  : "${COORDINATOR:?set COORDINATOR=HOST:PORT of node 0}"
  cmd+=(--config.distributed.coordinator="$COORDINATOR"
    --config.distributed.num_processes="$NUM_NODES"
    --config.distributed.process_id="$NODE_RANK")
fi
read -ra extra <<<"$ARGS"
# exec: SIGTERM (preemption, scancel, a time limit) reaches the run itself.
exec "${cmd[@]}" ${extra[@]+"${extra[@]}"} "$@"
