#!/usr/bin/env bash
# Copies a gs:// directory (model, dataset) to the same local path on every worker.
usage() {
  cat <<'USAGE'
Usage: ./stage_data.sh [--dry-run] gs://BUCKET/SRC /ABSOLUTE/DEST

On every worker of $TPU_NAME: `gcloud storage rsync -r gs://BUCKET/SRC /ABSOLUTE/DEST` (creates
DEST). The model (--config.model.path) and dataset files (--config.data.source_dir,
--config.eval.source_dir) are read from local directories, and every worker reads the same
path: stage them with this, then pass DEST to launch.sh.

  --dry-run   print the gcloud command instead of running it
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
((${#ARGS[@]} == 2)) || usage_error "needs a gs:// source and an absolute destination"
src="${ARGS[0]}" dst="${ARGS[1]}"
[[ "$src" == gs://* ]] || die "$src is not gs://"
[[ "$dst" == /* ]] || die "$dst is not an absolute path (every worker must see the same path)"
tpu_ssh all "mkdir -p $(printf %q "$dst") && gcloud storage rsync -r $(printf %q "$src") \
$(printf %q "$dst") && echo \"\$(hostname): $(printf %q "$dst") ready\""
