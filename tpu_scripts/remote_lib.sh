# shellcheck shell=bash
# Functions the TPU scripts define on every worker before their command (tpu_ssh sends this
# file's text). The launched run writes ~/run.pid (the Python process), ~/run.workdir, ~/run.log.

run_pid() {  # prints the pid of the live run on this worker; fails when there is none
  local pid
  pid="$(cat ~/run.pid 2>/dev/null)" || return 1
  # The pid file can outlive its process and the pid be reused: check what the process is.
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'experiments\.main' || return 1
  echo "$pid"
}

refuse_if_running() {
  local pid
  if pid="$(run_pid)"; then
    echo "$(hostname): FAIL a run is alive (pid $pid): stop it first (stop.sh)"
    return 1
  fi
}

# preflight REMOTE_DIR PATH...: this worker can start a run (installed, no live run, PATHs
# exist; relative ones are checked from REMOTE_DIR, where the run starts).
preflight() {
  local dir="$1" ok=1 p
  shift
  refuse_if_running || ok=0
  if ! cd "$dir" 2>/dev/null || [[ ! -x .venv/bin/python ]]; then
    echo "$(hostname): FAIL $dir/.venv/bin/python missing: run install.sh"
    return 1
  fi
  for p in "$@"; do
    if [[ ! -e "$p" ]]; then
      echo "$(hostname): FAIL $p does not exist here (data and model must be at the same path on every worker)"
      ok=0
    fi
  done
  if ((ok)); then echo "$(hostname): ready"; else return 1; fi
}

# stop_run SIGNAL WAIT: sends SIGNAL to the run; with WAIT=1 waits until it has exited.
stop_run() {
  local pid
  if ! pid="$(run_pid)"; then
    echo "$(hostname): no run alive"
    return 0
  fi
  kill -s "$1" "$pid"
  echo "$(hostname): sent SIG$1 to pid $pid"
  if (("$2")); then
    while [[ "$(run_pid)" == "$pid" ]]; do sleep 1; done  # (an unreaped zombie counts as gone)
    echo "$(hostname): pid $pid exited"
  fi
}

# run_status LINES: alive or not, and the log's last LINES lines (progress-bar redraws, written
# with carriage returns, become lines of their own).
run_status() {
  local pid
  if pid="$(run_pid)"; then
    echo "== $(hostname): running (pid $pid, for $(ps -o etime= -p "$pid" | tr -d ' '))"
  else
    echo "== $(hostname): not running"
  fi
  if [[ -f ~/run.log ]]; then
    tail -c 200000 ~/run.log | tr '\r' '\n' | grep -v '^[[:space:]]*$' | tail -n "$1"
  else
    echo "(no ~/run.log)"
  fi
}

# newest_checkpoints [WORKDIR]: the newest committed step of each checkpoint directory of the run
# (WORKDIR, default the launched run's), and whether the run finished (WORKDIR/DONE).
newest_checkpoints() {
  local wd="${1:-$(cat ~/run.workdir 2>/dev/null)}"
  wd="${wd%/}"
  if [[ -z "$wd" ]]; then
    echo "no workdir given and no ~/run.workdir (nothing launched here)"
    return 0
  fi
  local listing path rel step dir found=0
  # Committed steps only: Orbax writes commit_success.txt last. Sequential runs have one
  # checkpoint directory per stage (stage1_<method>/checkpoints, ...).
  if [[ "$wd" == gs://* ]]; then
    listing="$(gcloud storage ls "$wd/checkpoints/*/commit_success.txt" \
      "$wd/*/checkpoints/*/commit_success.txt" 2>/dev/null || true)"
  else
    listing="$(ls -d "$wd"/checkpoints/*/commit_success.txt \
      "$wd"/*/checkpoints/*/commit_success.txt 2>/dev/null || true)"
  fi
  declare -A newest=()
  while read -r path; do
    rel="${path#"$wd"/}"
    step="${rel%/commit_success.txt}"
    dir="${step%/*}"
    step="${step##*/}"
    [[ "$step" =~ ^[0-9]+$ ]] || continue
    if [[ -z "${newest[$dir]:-}" ]] || ((step > newest[$dir])); then newest[$dir]=$step; fi
  done <<<"$listing"
  for dir in "${!newest[@]}"; do
    echo "$wd/$dir: newest step ${newest[$dir]}"
    found=1
  done
  if ((!found)); then echo "$wd: no committed checkpoint yet"; fi
  if [[ "$wd" == gs://* ]]; then
    if gcloud storage ls "$wd/DONE" >/dev/null 2>&1; then echo "$wd/DONE: finished"; fi
  elif [[ -e "$wd/DONE" ]]; then
    echo "$wd/DONE: finished"
  fi
}
