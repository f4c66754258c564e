#!/usr/bin/env bash
# Follows a worker's run log.
usage() {
  cat <<'USAGE'
Usage: ./logs.sh [--worker N] [--lines N] [--no-follow] [--dry-run]

Shows the last lines of ~/run.log on worker N (default 0, the one that draws the progress bar
and writes metrics) and follows it (Ctrl-C stops following; the run goes on).

  --worker N   which worker (default 0)
  --lines N    how many lines first (default 100)
  --no-follow  print and exit
  --dry-run    print the gcloud command instead of running it
  -h, --help   this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
worker=0 lines=100 follow=(-f)
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --worker) worker="${2:?--worker needs a number}"; shift ;;
    --lines) lines="${2:?--lines needs a number}"; shift ;;
    --no-follow) follow=() ;;
    *) usage_error "unexpected argument: $1" ;;
  esac
  shift
done
[[ "$worker" =~ ^[0-9]+$ && "$lines" =~ ^[0-9]+$ ]] || usage_error "--worker and --lines take numbers"
tpu_ssh "$worker" "tail -n $lines ${follow[*]} ~/run.log"
