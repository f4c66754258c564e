#!/usr/bin/env bash
# Settings and helpers shared by the TPU scripts (sourced by them, not run). Every setting can be
# overridden in the environment; ZONE, RUNTIME and TOPOLOGY default from ACCELERATOR's generation.
# shellcheck disable=SC2034  # variables used by the scripts that source this file
set -euo pipefail

: "${TPU_NAME:=es-jax}"     # TPU VM / pod slice name
: "${ACCELERATOR:=v4-8}"    # v4-8, v4-32, v5litepod-8, v5p-8, v6e-8, ...
: "${PROJECT:=}"            # empty: gcloud's configured project
: "${REPO_URL:=}"           # git URL of this repo (default: copy the local tree)
: "${REMOTE_DIR:=es_jax}"   # checkout directory on every worker, relative to the home directory
: "${PYTHON:=python}"       # local Python that runs the memory planner

# Zone and runtime (TPU software version) per generation, from cloud.google.com/tpu/docs/
# regions-zones and /runtimes (checked 2026-12). Other zones: see docs/tpu.md.
case "$ACCELERATOR" in
  v4-*) zone0=us-central2-b runtime0=tpu-ubuntu2204-base ;;
  v5litepod-*) zone0=us-west4-a runtime0=v2-alpha-tpuv5-lite ;;
  v5p-*) zone0=us-east5-a runtime0=v2-alpha-tpuv5 ;;
  v6e-*) zone0=us-east5-b runtime0=v2-alpha-tpuv6e ;;
  *) zone0="" runtime0="" ;;
esac
: "${ZONE:=$zone0}"
: "${RUNTIME:=$runtime0}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(dirname "$here")"
DRY_RUN=0
YES=0
ARGS=()

die() {  # die MESSAGE: one line on stderr, exit 2
  echo "$(basename "$0"): $*" >&2
  exit 2
}

note() { echo "$*" >&2; }

# parse_common "$@": handles -h/--help (prints `usage`, exits 0), --dry-run and --yes; leaves the
# other arguments, in order, in ARGS. Each script defines `usage` before calling it.
parse_common() {
  while (($#)); do
    case "$1" in
      -h | --help)
        usage
        exit 0
        ;;
      --dry-run) DRY_RUN=1 ;;
      -y | --yes) YES=1 ;;
      *) ARGS+=("$1") ;;
    esac
    shift
  done
}

usage_error() {  # usage_error MESSAGE: the message and the usage on stderr, exit 2
  echo "$(basename "$0"): $1" >&2
  usage >&2
  exit 2
}

# topology_for ACCELERATOR: the planner's topology name (v5e:2x4, v4:2x2x1, ...), or nothing.
# v4/v5p types count TensorCores (2 per chip), v5litepod/v6e types count chips.
topology_for() {
  local gen="${1%-*}" n="${1##*-}" chips
  case "$gen" in
    v4 | v5p) chips=$((n / 2)) ;;
    v5litepod | v6e) chips=$n ;;
    *) return 0 ;;
  esac
  local shape
  case "$gen:$chips" in
    v4:4 | v5p:4) shape=2x2x1 ;;
    v4:8 | v5p:8) shape=2x2x2 ;;
    v4:16 | v5p:16) shape=2x2x4 ;;
    v4:32 | v5p:32) shape=2x4x4 ;;
    v4:64 | v5p:64) shape=4x4x4 ;;
    *:1) shape=1x1 ;;
    *:4) shape=2x2 ;;
    *:8) shape=2x4 ;;
    *:16) shape=4x4 ;;
    *:32) shape=4x8 ;;
    *:64) shape=8x8 ;;
    *) return 0 ;;
  esac
  gen="${gen/v5litepod/v5e}"
  echo "$gen:$shape"
}

check_settings() {  # fails with a clear line when the zone or runtime cannot be derived
  [[ -n "$ZONE" ]] || die "no default zone for ACCELERATOR=$ACCELERATOR: set ZONE (see docs/tpu.md)"
  [[ -n "$RUNTIME" ]] || die "no default runtime for ACCELERATOR=$ACCELERATOR: set RUNTIME"
}

quoted() {  # quoted ARGS...: one line, each argument shell-quoted (bash reads back the same)
  local line
  printf -v line '%q ' "$@"
  echo "${line% }"
}

# single_quoted TEXT: TEXT in single quotes (`quoted` when it spans lines), read back by bash.
single_quoted() {
  local q="'\\''"
  if [[ "$1" == *$'\n'* ]]; then quoted "$1"; else echo "'${1//\'/$q}'"; fi
}

# run CMD...: runs CMD, or under --dry-run prints it as one shell-quoted line on stdout instead.
run() {
  if ((DRY_RUN)); then quoted "$@"; else "$@"; fi
}

where() {  # where: the --zone/--project flags, one per line
  printf '%s\n' --zone "$ZONE"
  if [[ -n "$PROJECT" ]]; then printf '%s\n' --project "$PROJECT"; fi
}

# tpu_gcloud SUBCOMMAND ARGS...: `gcloud compute tpus tpu-vm SUBCOMMAND` with the zone/project.
tpu_gcloud() {
  check_settings
  local flags
  mapfile -t flags < <(where)
  run gcloud compute tpus tpu-vm "$1" "${@:2}" "${flags[@]}"
}

# tpu_ssh WORKER COMMAND: runs COMMAND (a bash script, the remote library defined first) on
# WORKER ("all" or an index) of $TPU_NAME. --dry-run prints the gcloud line with COMMAND but
# not the library's text: `"$(cat .../remote_lib.sh)"` stands for it (bash runs the line as is).
tpu_ssh() {
  local lib flags
  if ((DRY_RUN)); then
    check_settings
    mapfile -t flags < <(where)
    # shellcheck disable=SC2016  # the $(cat ...) is printed for the reader's bash
    printf '%s --command "$(cat %s)"%s%s\n' \
      "$(quoted gcloud compute tpus tpu-vm ssh "$TPU_NAME" --worker="$1" "${flags[@]}")" \
      "$(quoted "$here/remote_lib.sh")" "\$'\\n'" "$(single_quoted "$2")"
    return 0
  fi
  lib="$(sed -e '/^[[:space:]]*#/d' -e '/^$/d' "$here/remote_lib.sh")"  # comments stay here
  tpu_gcloud ssh "$TPU_NAME" --worker="$1" --command "$lib"$'\n'"$2"
}

# confirm QUESTION: goes on after a yes on the terminal; --yes skips the question and --dry-run
# does not ask (it changes nothing). Without a terminal and without --yes it refuses.
confirm() {
  if ((YES)); then return 0; fi
  if ((DRY_RUN)); then
    note "(dry run: would ask \"$1\")"
    return 0
  fi
  [[ -t 0 ]] || die "$1 Refusing without a terminal to ask on; pass --yes."
  local reply
  read -r -p "$1 [y/N] " reply
  [[ "$reply" == y || "$reply" == Y || "$reply" == yes ]] || {
    note "aborted"
    exit 1
  }
}
