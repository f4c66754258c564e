#!/usr/bin/env bash
# Is the run alive on each worker, its log's last lines, and its newest checkpoint step.
usage() {
  cat <<'USAGE'
Usage: ./status.sh [--lines N] [--dry-run] [WORKDIR]

For every worker of $TPU_NAME: whether the run launched by launch.sh is alive and the last N
lines of ~/run.log (default 5). Then, from worker 0, the newest committed checkpoint step of the
run's workdir (WORKDIR, default the one launch.sh recorded) and whether it finished (DONE).

  --lines N   log lines per worker (default 5)
  --dry-run   print the gcloud commands instead of running them
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
lines=5 workdir=""
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --lines) lines="${2:?--lines needs a number}"; shift ;;
    -*) usage_error "unknown option: $1" ;;
    *)
      [[ -z "$workdir" ]] || usage_error "one WORKDIR at most"
      workdir="$1"
      ;;
  esac
  shift
done
[[ "$lines" =~ ^[0-9]+$ ]] || usage_error "--lines takes a number"
tpu_ssh all "run_status $lines"
tpu_ssh 0 "newest_checkpoints $(printf %q "$workdir")"
