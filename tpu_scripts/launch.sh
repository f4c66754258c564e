#!/usr/bin/env bash
# Starts the same experiment on every worker (jax.distributed joins them), detached.
usage() {
  cat <<'USAGE'
Usage: ./launch.sh [--skip-plan] [--topology T] [--dry-run] CONFIG WORKDIR [--config.KEY=VALUE...]

Runs `python -m experiments.main --config CONFIG --workdir WORKDIR OVERRIDES` on every worker of
$TPU_NAME, detached, appending to ~/run.log there (follow with logs.sh, check with status.sh,
stop with stop.sh). Rerunning the same command after a preemption or stop.sh resumes from the
newest checkpoint. Each override must be one argument of the form --config.KEY=VALUE; quote it
for your shell, e.g. --config.eval.extra_tasks="('aime24', 'aime25')": it reaches the workers
unchanged.

Before launching:
  1. the memory planner runs here: `$PYTHON -m experiments.tpu.plan --config CONFIG
     --topology T OVERRIDES` (T from $ACCELERATOR, or --topology); a non-zero exit (a program
     does not fit in HBM) stops the launch. --skip-plan skips it.
  2. every worker is checked: installed (install.sh), no run alive, and each local path given
     as --config.model.path / data.source_dir / eval.source_dir / data.data_dir exists there
     (data and model must sit at the same local path on every worker: stage_data.sh; the
     loaders do not read gs://, so a gs:// value there is refused).

WORKDIR should be gs://: every host must see the same checkpoints and results.

  --skip-plan   launch without the memory planner
  --topology T  the planner's topology (default from ACCELERATOR, e.g. v5litepod-8 -> v5e:2x4)
  --dry-run     print the commands (planner, checks, launch) instead of running them
  -h, --help    this help
USAGE
}
source "$(dirname "$0")/common.sh"
parse_common "$@"
skip_plan=0 topology="${TOPOLOGY:-}"
pos=() overrides=()
set -- "${ARGS[@]}"
while (($#)); do
  case "$1" in
    --skip-plan) skip_plan=1 ;;
    --topology) topology="${2:?--topology needs a value, e.g. v5e:2x4}"; shift ;;
    --topology=*) topology="${1#*=}" ;;
    --config.*=*) overrides+=("$1") ;;
    --config.*) usage_error "$1: write overrides as one argument, --config.KEY=VALUE" ;;
    -*) usage_error "unknown option: $1 (only --config.KEY=VALUE overrides reach the run)" ;;
    *) pos+=("$1") ;;
  esac
  shift
done
((${#pos[@]} == 2)) || usage_error "needs CONFIG and WORKDIR (got ${#pos[@]} positional arguments)"
config="${pos[0]}" workdir="${pos[1]}"
[[ -f "$repo_root/${config%%:*}" ]] || die "config ${config%%:*} not found under $repo_root"
check_settings
cd "$repo_root"  # CONFIG is relative to the repository root, here and on the workers
if [[ "$workdir" != gs://* ]]; then
  note "warning: $workdir is not gs://: each worker writes its own copy; multi-host runs need gs://"
fi

# 1. The memory planner, here (it compiles for the topology; no TPU needed).
if ((skip_plan)); then
  note "skipping the memory planner (--skip-plan)"
else
  [[ -f "$repo_root/experiments/tpu/plan.py" ]] ||
    die "experiments/tpu/plan.py (the memory planner) is not in this tree: cannot check that the \
run fits; pass --skip-plan to launch unchecked"
  : "${topology:=$(topology_for "$ACCELERATOR")}"
  [[ -n "$topology" ]] || die "no planner topology known for ACCELERATOR=$ACCELERATOR: pass --topology"
  note "memory planner for $topology (planner output: see docs/tpu_plan.md)"
  if ! run "$PYTHON" -m experiments.tpu.plan --config "$config" --topology "$topology" \
    "${overrides[@]}"; then
    die "the memory planner says the run does not fit on $topology (table above): not launched; \
change the overrides (e.g. smaller members_per_chunk) or pass --skip-plan"
  fi
fi

# 2. Every worker: installed, idle, local paths present.
paths=()
for o in "${overrides[@]}"; do
  case "$o" in
    --config.model.path=* | --config.data.source_dir=* | --config.eval.source_dir=* | \
      --config.data.data_dir=*)
      value="${o#*=}"
      case "$value" in
        "~"*) die "$o: ~ is not expanded inside an override; give an absolute path" ;;
        gs://*) die "$o: the model and dataset loaders read local directories only; copy it to \
the workers with stage_data.sh and give that path" ;;
        /* | ./* | ../*) paths+=("$value") ;;
      esac
      ;;
  esac
done
dir_q="$(printf %q "$REMOTE_DIR")"
if ((DRY_RUN)); then
  tpu_ssh all "preflight $(quoted "$REMOTE_DIR" "${paths[@]}")"
else
  rc=0
  report="$(tpu_ssh all "preflight $(quoted "$REMOTE_DIR" "${paths[@]}")")" || rc=$?
  echo "$report"
  if ((rc)) || grep -q ': FAIL ' <<<"$report" || ! grep -q ': ready' <<<"$report"; then
    die "not launched: a worker is not ready (lines above)"
  fi
fi

# 3. Launch. Two shells parse the command on a worker: the ssh login shell, then `script`'s
# (which gives the run a terminal, so that worker 0 draws its progress bar into run.log), so the
# Python command is quoted twice; `exec` makes ~/run.pid the Python process for stop.sh.
inner="stty cols 120 rows 40 2>/dev/null; echo \$\$ > ~/run.pid; exec $(quoted .venv/bin/python \
  -m experiments.main --config "$config" --workdir "$workdir" "${overrides[@]}")"
tpu_ssh all "cd $dir_q && printf '%s\n' $(quoted "$workdir") > ~/run.workdir && \
printf '\n=== %s launch on %s\n' \"\$(date -u +%FT%TZ)\" \"\$(hostname)\" >> ~/run.log && \
{ SHELL=/bin/bash nohup script -qefc $(printf %q "$inner") /dev/null >> ~/run.log 2>&1 < /dev/null & \
} && echo \"\$(hostname): launched\""
((DRY_RUN)) || note "launched on $TPU_NAME; follow with ./logs.sh, check with ./status.sh"
