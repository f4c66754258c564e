#!/usr/bin/env bash
# Copies a run's results (metrics, eval tables, plots, report; not checkpoints) to a local dir.
# Usage: ./fetch.sh gs://BUCKET/runs/es ./results/es
source "$(dirname "$0")/common.sh"
src="$1"; dst="$2"
mkdir -p "$dst"
gcloud storage rsync -r -x '.*checkpoints/.*|.*stage[12]_.*/checkpoints/.*|.*hf/.*' "$src" "$dst"
