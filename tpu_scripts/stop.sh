#!/usr/bin/env bash
# Stops the run on every worker: SIGTERM, so the runner saves a checkpoint and exits 0.
usage() {
  cat <<'USAGE'
Usage: ./stop.sh [--wait] [--kill [--yes]] [--dry-run]

Sends SIGTERM to the run launched by launch.sh on every worker of $TPU_NAME. The runner finishes
the current step, saves a checkpoint and exits 0 (the same as a preemption); launch.sh with the
same arguments resumes it. A step can take minutes: --wait waits until every worker's run exited.

  --wait      wait until the run has exited on every worker
  --kill      SIGKILL instead, for a hung run: loses the steps since the last checkpoint
              (asks first unless --yes)
  --dry-run   print the gcloud command instead of running it
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
signal=TERM wait=0
for a in "${ARGS[@]}"; do
  case "$a" in
    --wait) wait=1 ;;
    --kill) signal=KILL ;;
    *) usage_error "unexpected argument: $a" ;;
  esac
done
check_settings
if [[ "$signal" == KILL ]]; then
  confirm "SIGKILL the run on every worker of $TPU_NAME (steps since the last checkpoint are lost)?"
fi
tpu_ssh all "stop_run $signal $wait"
