#!/usr/bin/env bash
# Copies a run's results from its gs:// workdir to a local directory.
usage() {
  cat <<'USAGE'
Usage: ./fetch.sh [--all] [--dry-run] gs://BUCKET/RUN LOCAL_DIR

Copies a run's results (metrics.jsonl, config, eval/ tables, plots, DONE) from its gs://
workdir to LOCAL_DIR, leaving out checkpoints/ and the exported model hf/ unless --all.

  --all       copy everything, checkpoints and hf/ too
  --dry-run   print the commands instead of running them
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
all=0
pos=()
for a in "${ARGS[@]}"; do
  case "$a" in
    --all) all=1 ;;
    -*) usage_error "unknown option: $a" ;;
    *) pos+=("$a") ;;
  esac
done
((${#pos[@]} == 2)) || usage_error "needs a gs:// workdir and a local directory"
src="${pos[0]%/}"
dst="${pos[1]}"
[[ "$src" == gs://* ]] || die "$src is not gs://: fetch.sh copies from a gs:// workdir"
exclude=()
if ((!all)); then exclude=(-x '.*checkpoints/.*|.*hf/.*'); fi
run mkdir -p "$dst"
run gcloud storage rsync -r "${exclude[@]}" "$src" "$dst"
