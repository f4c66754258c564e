#!/usr/bin/env bash
# Creates the TPU VM (or pod slice) named $TPU_NAME. Usage: [ACCELERATOR=v4-32] ./create.sh [--spot]
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm create "$TPU_NAME" --zone "$ZONE" --project "$PROJECT" \
  --accelerator-type "$ACCELERATOR" --version "$RUNTIME" "$@"
