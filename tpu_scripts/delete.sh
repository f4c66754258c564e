#!/usr/bin/env bash
# Deletes the TPU VM (stops billing). Checkpoints in gs:// stay.
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone "$ZONE" --project "$PROJECT" --quiet
