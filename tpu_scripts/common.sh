#!/usr/bin/env bash
# Settings shared by the TPU scripts. Override any of them in the environment.
set -euo pipefail
: "${TPU_NAME:=es-jax}"                    # TPU VM / pod slice name
: "${ZONE:=us-central2-b}"                  # a zone with the accelerator type below
: "${ACCELERATOR:=v4-8}"                    # v4-8, v4-32, v5litepod-8, ...
: "${RUNTIME:=tpu-ubuntu2204-base}"         # TPU VM software version
: "${PROJECT:=$(gcloud config get-value project 2>/dev/null)}"
: "${REPO_URL:=}"                           # git URL of this repo (default: copy the local tree)
: "${REMOTE_DIR:=es_jax}"                   # checkout directory on every worker
export TPU_NAME ZONE ACCELERATOR RUNTIME PROJECT REPO_URL REMOTE_DIR

tpu_ssh() {  # tpu_ssh COMMAND: runs COMMAND on every worker of the slice
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --project "$PROJECT" \
    --worker=all --command "$1"
}
