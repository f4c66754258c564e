#!/usr/bin/env bash
# Puts this repo on every worker (a fresh copy) and installs it with the TPU extra.
usage() {
  cat <<'USAGE'
Usage: ./install.sh [--yes] [--dry-run]

On every worker of $TPU_NAME: deletes ~/$REMOTE_DIR (default ~/es_jax: the old checkout and its
.venv), puts this repository there (a git clone of $REPO_URL, or else a copy of the local tree
without .git, .venv and runs/), creates .venv and runs `pip install -e '.[tpu]'`, then prints
jax.devices(). Refuses on a worker whose run is alive. Asks first unless --yes.

  -y, --yes   do not ask before the wipe
  --dry-run   print the commands instead of running them
  -h, --help  this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
((${#ARGS[@]} == 0)) || usage_error "unexpected argument: ${ARGS[0]}"
check_settings
confirm "Wipe ~/$REMOTE_DIR (code and .venv) on every worker of $TPU_NAME and reinstall?"
dir_q="$(printf %q "$REMOTE_DIR")"
if [[ -n "$REPO_URL" ]]; then
  tpu_ssh all "refuse_if_running && rm -rf $dir_q && git clone -q $(printf %q "$REPO_URL") $dir_q"
else
  tarball="${TMPDIR:-/tmp}/es_jax_src.$$.tgz"
  if ((!DRY_RUN)); then trap 'rm -f "$tarball"' EXIT; fi
  run tar -C "$repo_root" --exclude=./.venv --exclude=./runs --exclude=./.git \
    --exclude=__pycache__ -czf "$tarball" .
  tpu_gcloud scp "$tarball" "$TPU_NAME:~/es_jax_src.tgz" --worker=all
  tpu_ssh all "refuse_if_running && rm -rf $dir_q && mkdir -p $dir_q && \
tar -C $dir_q -xzf ~/es_jax_src.tgz && rm ~/es_jax_src.tgz"
fi
tpu_ssh all "cd $dir_q && python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip && \
.venv/bin/pip install -q -e '.[tpu]' && .venv/bin/python -c 'import jax; print(jax.devices())'"
