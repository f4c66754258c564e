#!/usr/bin/env bash
# Puts this repo on every worker and installs it with the TPU extra (jax[tpu], pinned).
source "$(dirname "$0")/common.sh"
if [[ -n "$REPO_URL" ]]; then
  tpu_ssh "rm -rf $REMOTE_DIR && git clone -q $REPO_URL $REMOTE_DIR"
else
  root="$(cd "$(dirname "$0")/.." && pwd)"
  tar -C "$root" --exclude=.venv --exclude=runs --exclude=.git -czf /tmp/es_jax_src.tgz .
  gcloud compute tpus tpu-vm scp /tmp/es_jax_src.tgz "$TPU_NAME":~/ --zone "$ZONE" \
    --project "$PROJECT" --worker=all
  tpu_ssh "rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar -C $REMOTE_DIR -xzf ~/es_jax_src.tgz"
fi
tpu_ssh "cd $REMOTE_DIR && python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip && \
  .venv/bin/pip install -q -e '.[tpu]' && .venv/bin/python -c 'import jax; print(jax.devices())'"
