#!/usr/bin/env bash
# Creates the TPU VM (or pod slice) $TPU_NAME.
usage() {
  cat <<'USAGE'
Usage: [ACCELERATOR=v5litepod-8] ./create.sh [--dry-run] [GCLOUD_FLAGS...]

Creates the TPU VM / pod slice $TPU_NAME (default es-jax) of type $ACCELERATOR (default v4-8).
ZONE and RUNTIME default from the generation (v4: us-central2-b, tpu-ubuntu2204-base;
v5litepod: us-west4-a, v2-alpha-tpuv5-lite; v5p: us-east5-a, v2-alpha-tpuv5;
v6e: us-east5-b, v2-alpha-tpuv6e); set them to use another zone. Other flags go to
`gcloud compute tpus tpu-vm create`, e.g. --spot (preemptible capacity).

  --dry-run   print the gcloud command instead of running it
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
tpu_gcloud create "$TPU_NAME" --accelerator-type "$ACCELERATOR" --version "$RUNTIME" \
  "${ARGS[@]}"
