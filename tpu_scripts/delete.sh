#!/usr/bin/env bash
# Deletes the TPU VM (stops billing), after asking.
usage() {
  cat <<'USAGE'
Usage: ./delete.sh [--yes] [--dry-run]

Deletes the TPU VM / pod slice $TPU_NAME (default es-jax) in $ZONE: billing stops, the workers'
disks (checkout, ~/run.log, any local data or workdir) are lost; gs:// workdirs stay.
Asks first unless --yes.

  -y, --yes   do not ask
  --dry-run   print the gcloud command instead of running it
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
((${#ARGS[@]} == 0)) || usage_error "unexpected argument: ${ARGS[0]}"
check_settings
confirm "Delete TPU $TPU_NAME in $ZONE (its disks are lost; gs:// stays)?"
tpu_gcloud delete "$TPU_NAME" --quiet
