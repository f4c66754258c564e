#!/usr/bin/env bash
# One command after a Spot preemption: recreates the TPU VM if it is gone, then the same launch.
usage() {
  cat <<'USAGE'
Usage: ./resume.sh [--stage gs://SRC /DEST]... [--dry-run] CONFIG WORKDIR [LAUNCH_ARGS...]

Brings the run back after a Spot preemption (or any loss of the VM), then relaunches it; the run
resumes from the newest committed checkpoint in WORKDIR. Give it the launch.sh arguments of the
original run (CONFIG WORKDIR --config.KEY=VALUE..., --skip-plan, --topology T) and one --stage
per stage_data.sh of the original setup. Asks the state of $TPU_NAME, then:

  READY                       launch.sh LAUNCH_ARGS (it refuses while a run is alive)
  gone                        create.sh $CREATE_FLAGS, install.sh --yes, each stage_data.sh,
                              launch.sh
  PREEMPTED, TERMINATED       delete.sh --yes first (a preempted Spot VM cannot be restarted),
                              then as when gone
  anything else               nothing (CREATING, DELETING, ...: wait and run it again)

CREATE_FLAGS (default --spot) go to create.sh; set CREATE_FLAGS= for on-demand capacity.

  --stage SRC DEST  a stage_data.sh SRC DEST to redo on a new VM (repeatable)
  --dry-run         print the commands of the recreate path (the state is not asked)
  -h, --help        this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
: "${CREATE_FLAGS=--spot}"
stages=() launch_args=()
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --stage)
      (($# >= 3)) || usage_error "--stage needs gs://SRC and /DEST"
      stages+=("$2" "$3")
      shift 2
      ;;
    *) launch_args+=("$1") ;;
  esac
  shift
done
((${#launch_args[@]} >= 2)) || usage_error "needs the launch.sh arguments: CONFIG WORKDIR ..."
check_settings
pass=()
if ((DRY_RUN)); then pass=(--dry-run); fi
read -ra create_flags <<<"$CREATE_FLAGS"

recreate() {
  "$here/create.sh" "${pass[@]}" "${create_flags[@]}"
  "$here/install.sh" --yes "${pass[@]}"
  local i
  for ((i = 0; i < ${#stages[@]}; i += 2)); do
    "$here/stage_data.sh" "${pass[@]}" "${stages[i]}" "${stages[i + 1]}"
  done
}

if ((DRY_RUN)); then
  note "(dry run: the state of $TPU_NAME is not asked; these are the commands for a VM that is"
  note " gone; a PREEMPTED one is deleted first, a READY one only relaunched)"
  tpu_gcloud describe "$TPU_NAME" --format='value(state)'
  recreate
else
  rc=0 errors="$(mktemp)"
  trap 'rm -f "$errors"' EXIT
  state="$(tpu_gcloud describe "$TPU_NAME" --format='value(state)' 2>"$errors")" || rc=$?
  if ((rc)); then
    grep -q NOT_FOUND "$errors" || die "cannot ask the state of $TPU_NAME: $(cat "$errors")"
    state=""
  fi
  note "TPU $TPU_NAME in $ZONE: ${state:-gone}"
  case "$state" in
    READY) ;;
    "") recreate ;;
    PREEMPTED | TERMINATED)
      "$here/delete.sh" --yes
      recreate
      ;;
    STOPPED) die "TPU $TPU_NAME is STOPPED: start it (gcloud compute tpus tpu-vm start) or \
delete it (delete.sh), then run this again" ;;
    *) die "TPU $TPU_NAME is $state: wait until it is READY or gone, then run this again" ;;
  esac
fi
"$here/launch.sh" "${pass[@]}" "${launch_args[@]}"
