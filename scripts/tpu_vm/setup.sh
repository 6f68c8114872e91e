#!/usr/bin/env bash
# On every worker: clones REPO_URL at BRANCH (or pulls it), makes a Python
# virtual environment (~/venv-jaxgrpo), installs jax[tpu] and this package with
# EXTRAS, and copies DATA_URI (gs://, optional) to ~/DATA_DIR. Safe to rerun.
#
#   REPO_URL=https://github.com/you/jaxgrpo.git \
#     DATA_URI=gs://my-bucket/data scripts/tpu_vm/setup.sh
#
# Every worker must run the same code: push what you want to train first.
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${REPO_URL:?set REPO_URL (the git URL the workers clone)}"

repo=$(printf %q "$REPO_DIR")
branch=$(printf %q "$BRANCH")
cmd="set -e
if [ -d $repo/.git ]; then
  git -C $repo fetch --quiet origin $branch
  git -C $repo checkout --quiet --force -B $branch FETCH_HEAD
else
  git clone --quiet --branch $branch $(printf %q "$REPO_URL") $repo
fi
cd $repo && $(remote_env PYTHON_VERSION JAX_VERSION EXTRAS DATA_URI DATA_DIR VENV)bash scripts/tpu_vm/worker.sh setup"
tpu_ssh all --command="$cmd"
