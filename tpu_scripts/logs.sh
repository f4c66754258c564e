#!/usr/bin/env bash
# Follows worker 0's log (metrics and checkpoints go to the workdir).
source "$(dirname "$0")/common.sh"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --project "$PROJECT" --worker=0 \
  --command "tail -n 100 -f ~/run.log"
