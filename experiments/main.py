"""Runs the experiment a config file names.

    python -m experiments.main --config experiments/configs/NAME.py[:variant] --workdir DIR \
        [--config.key=value ...] [--dry_run] [--verbosity=1]
    python -m experiments.main --config experiments/configs/NAME.py --help_config

`--help_config` prints every key of the config (value, allowed values, meaning) and exits.
Compiled programs are kept in JAX's persistent compilation cache (experiments.infra.compile_cache;
~/.cache/es_jax/jax by default), so a rerun or a later stage loads them instead of compiling;
`--compile_cache=DIR` moves it, `--compile_cache=` turns it off.
`config.method` picks the runner from `experiments.configs.base.METHODS` (each module exposes
`run(config, workdir)`). The config is locked and validated once, before anything is loaded
(`experiments.schema.check`, from each field's declaration in `experiments.fields`): an unknown
key, a value of the wrong type or out of range is refused in one line `error: ...` naming the
dotted field (exit status 2, no traceback); so are missing files, bad data, a user's reward
that breaks its contract (docs/usage.md; at the check before the model loads or at any later
call), a workdir that holds another method's run and a run that
stopped because it cannot be learning (`experiments.runners.run_guard`: non-finite rewards or
weights, an
update too large). The data and evaluation files and the reward are checked before the model
loads. `--dry_run` prints the planned work (completions to generate, an estimated time), loads
the model and the data, then exits 0 without training. Rerunning the same command resumes from
the newest checkpoint in DIR; a SIGTERM at any moment (startup, a step, the final evaluation)
saves what was done and exits 0 (`es_jax.persist.preemption.sigterm_scope`, one flag for the whole
command); a second run on a DIR in use is refused (`experiments.infra.workdir_lock`). On a
multi-host TPU slice run the same command on every worker (jax.distributed joins them).

Output: one line per phase and per step (step, training reward, s/step, ETA) and progress lines
during the final evaluation; libraries (Orbax, JAX, absl) log warnings only. `--verbosity=1` shows
their INFO lines too and the traceback of user errors (so does ES_JAX_TRACEBACK=1).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import time

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from experiments.infra.workdir_lock import WorkdirLock, WorkdirLockedError
from experiments.schema.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "config file[:variant]; --help_config lists every key with its value, allowed values and meaning",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (local or gs://)")
_DRY_RUN = flags.DEFINE_bool(
  "dry_run", False, "validate the config, load the model and data, and exit without training"
)
_COMPILE_CACHE = flags.DEFINE_string(
  "compile_cache",
  None,
  "directory of JAX's persistent compilation cache (default: $ES_JAX_COMPILE_CACHE, else "
  "$XDG_CACHE_HOME/es_jax/jax or ~/.cache/es_jax/jax); empty turns it off",
)
_HELP_CONFIG = flags.DEFINE_bool(
  "help_config",
  False,
  "print every key of --config (value, allowed values, meaning) and exit; --workdir not needed",
)
flags.mark_flag_as_required("config")
log = logging.getLogger("experiments.main")
# Errors that a user fixes (a config value, a missing file, bad data): one line, exit status 2.
USER_ERRORS = (ConfigError, FileNotFoundError, WorkdirLockedError)
# Library loggers held at WARNING unless --verbosity >= 1 (Orbax logs through absl).
QUIET_LOGGERS = ("absl", "jax", "jaxlib", "orbax", "tensorboardX", "urllib3", "fsspec", "etils")


def show_tracebacks(argv: list[str] | None = None) -> bool:
  """Whether user errors keep their traceback: --verbosity >= 1 (or -v) or ES_JAX_TRACEBACK=1."""
  if os.environ.get("ES_JAX_TRACEBACK", "") not in ("", "0"):
    return True
  if argv is not None:  # before the flags are parsed
    for a in argv:
      m = re.fullmatch(r"--(?:verbosity|v)=(-?\d+)", a)
      if m and int(m.group(1)) >= 1:
        return True
    return False
  return flags.FLAGS.is_parsed() and flags.FLAGS.verbosity >= 1


def user_error(message: str) -> None:
  """Prints `error: <message>` on one line to stderr and exits with status 2."""
  print("error: " + " ".join(str(message).split()), file=sys.stderr, flush=True)
  sys.exit(2)


def _load_config_file(spec: str):
  """The config a `--config=path[:variant]` flag names (to list its fields)."""
  path, _, variant = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_config_for_hint", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def _config_spec(argv: list[str]) -> str | None:
  """The `--config` flag's value (path[:variant]), or None."""
  spec = None
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      spec = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def _broken_config_file(argv: list[str], e: BaseException) -> str:
  """One line for a config file that cannot be executed (not Python, an error at import)."""
  path = (_config_spec(argv) or "").partition(":")[0]
  if isinstance(e, SyntaxError):
    where = f"{e.filename or path}, line {e.lineno}"
    return f"--config {where}: {e.msg}; a config is a Python file defining get_config()."
  return f"--config {path}: loading it raised {type(e).__name__}: {e}"


def _unknown_override(argv: list[str], missing: str) -> str:
  """One line for an override naming a key the config lacks (`missing`: the failing leaf)."""
  from experiments.schema import check as config_check

  spec = _config_spec(argv)
  overrides = [a[len("--config.") :].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  try:
    config = _load_config_file(spec)
  except Exception:  # noqa: BLE001 - only for the hint; absl reports a broken file itself
    config = None
  fields = set(config_check.all_fields(config)) if config is not None else set()
  bad = [o for o in overrides if o not in fields and missing in o.split(".")]
  dotted = bad[0] if bad else missing
  if config is None:
    return f"config.{dotted} is not a config field."
  return config_check.unknown_key_message(config, dotted)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with configuration mistakes reported as one `error:` line."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:  # ml_collections: an override of a missing key
    if show_tracebacks(argv):
      raise
    if isinstance(e, AttributeError) and "get_config" in str(e):
      path = (_config_spec(argv) or "").partition(":")[0]
      user_error(f"--config {path}: the file defines no get_config() returning the config.")
    leaf = e.args[0] if e.args else ""
    leaf = leaf.args[0] if isinstance(leaf, BaseException) and leaf.args else leaf
    name = re.match(r"\W*(\w*)", str(leaf)).group(1)  # "'leaf' Did you mean ..." -> leaf
    user_error(_unknown_override(argv, name))
  except flags.Error as e:
    if show_tracebacks(argv):
      raise
    message = str(e)
    if "Traceback (most recent call last)" in message:  # raised by the config file's get_config
      errors = [
        ln.strip() for ln in message.splitlines() if re.match(r"\w+(Error|Exception)\b", ln)
      ]
      message = "--config: " + (errors[-1] if errors else message)
    user_error(message)
  except OSError as e:  # the config file could not be loaded
    if show_tracebacks(argv):
      raise
    user_error(str(e.__cause__ or e))
  except Exception as e:  # noqa: BLE001 - executing the config file failed (SyntaxError, ...)
    if show_tracebacks(argv):
      raise
    user_error(_broken_config_file(argv, e))
  return []


class _Formatter(logging.Formatter):
  """`HH:MM:SS message`; warnings and errors name their level."""

  def format(self, record: logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    level = "" if record.levelno < logging.WARNING else record.levelname.lower() + ": "
    text = f"{stamp} {level}{record.getMessage()}"
    if record.exc_info:
      text += "\n" + self.formatException(record.exc_info)
    return text


def setup_logging(verbosity: int) -> None:
  """Our loggers at INFO, libraries' at WARNING (verbosity <= 0); everything at INFO/DEBUG above.

  Also quiets absl's own handler when it is installed (absl.app does so).
  """
  if verbosity >= 1:
    logging.getLogger().setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO)
    for name in QUIET_LOGGERS:
      logging.getLogger(name).setLevel(logging.NOTSET)
    return
  logging.getLogger().setLevel(logging.WARNING)
  for name in QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.WARNING)
  for name in ("experiments", "es_jax"):
    logging.getLogger(name).setLevel(logging.INFO)
  absl_logging.set_verbosity(absl_logging.WARNING)
  handler = absl_logging.get_absl_handler()
  handler.setFormatter(_Formatter())


def dry_run(config, workdir: str) -> dict:
  """Loads what the config's method reads (model, training pool, evaluation sets, reward; for
  method=evaluate the model and evaluation sets, disjoint from the training pool when it loads, as
  evaluate.run); trains nothing. `config` was validated (`_main`)."""
  import jax

  from es_jax import models
  from experiments.evaluation import evaluate
  from experiments.runners import model_io, run_context, run_data, work_plan
  from experiments.schema import check as config_check

  t0 = time.perf_counter()
  if config.method == "evaluate":  # the training pool only to exclude its prompts
    evaluator = evaluate.Evaluator(config, None, run_data.run_keys(config.seed))  # files first
    with config_check.user_errors("config.model"):
      model, tokenizer = model_io.load_model(config.model, seed=config.seed)
    params, dtype = models.params(model), model.config.dtype
    train_examples, mesh = 0, {}
  else:
    ctx = run_context.make_context(config, workdir)
    params, dtype, evaluator = ctx.base_params, ctx.model_config.dtype, ctx.evaluator
    train_examples, mesh = len(ctx.examples), dict(ctx.mesh.shape)
  n_params = sum(int(x.size) for x in jax.tree.leaves(params))
  problems = len(evaluator.examples) + sum(len(spec.examples) for spec in evaluator.extra)
  rows = work_plan.plan(config, problems)
  extra = work_plan.conditional(config, problems)
  return {
    "dry_run": True,
    "method": config.method,
    **({"planned_work": work_plan.summary(rows, n_params, extra)} if rows else {}),
    "model_parameters": n_params,
    "model_dtype": dtype,
    "train_examples": train_examples,
    "eval_problems": len(evaluator.examples),
    "extra_eval_tasks": [spec.label for spec in evaluator.extra],
    "mesh": mesh,
    "seconds": round(time.perf_counter() - t0, 1),
  }


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  setup_logging(flags.FLAGS.verbosity)
  if _HELP_CONFIG.value:
    from experiments.schema import docs as config_docs

    print(config_docs.describe(_CONFIG.value))
    return
  if not _WORKDIR.value:
    user_error("--workdir is required: the run directory (local or gs://).")
  from es_jax.persist import preemption
  from experiments.infra import compile_cache

  cache = _COMPILE_CACHE.value
  cache = compile_cache.enable(compile_cache.default_dir() if cache is None else cache)
  compile_cache.compile_seconds()  # starts counting
  # One SIGTERM flag from here to the end (every stage, the final evaluation and export): a
  # SIGTERM at any moment ends the run with its state saved and exit status 0.
  with preemption.sigterm_scope():
    summary = _main()
  log.info(
    "compiling took %.1f s in this process (persistent cache: %s)",
    compile_cache.compile_seconds(),
    cache or "off",
  )
  print(json.dumps(summary, indent=1, default=str))


def _main() -> dict:
  from es_jax.devices import sharding
  from es_jax.rewards import RewardError
  from experiments.configs.base import METHODS

  # a run that cannot be learning: one line
  from experiments.runners.run_guard import RunDivergedError
  from experiments.schema import check as config_check

  try:
    sharding.initialize_distributed()
    try:
      config = config_check.validate(_CONFIG.value)
    except OSError as e:  # the config file is missing or broken (raised on first access)
      raise ConfigError(f"--config: {e}") from e
    config_check.check_workdir(config, _WORKDIR.value)
    log.info("%s", config_check.compact(config))
    if _DRY_RUN.value:
      summary = dry_run(config, _WORKDIR.value)
    else:
      module, function = METHODS[config.method].split(":")
      runner = getattr(importlib.import_module(module), function)
      log.info("%s run in %s", config.method, _WORKDIR.value)
      with WorkdirLock(_WORKDIR.value):
        result = runner(config, _WORKDIR.value)
      summary = {k: v for k, v in (result or {}).items() if k in ("stopped", "eval", "report")}
  except (*USER_ERRORS, RewardError, RunDivergedError) as e:
    reward_error = e if isinstance(e, RewardError) else e.__cause__
    if show_tracebacks():
      if isinstance(reward_error, RewardError) and reward_error.traceback:
        print(f"The reward's traceback:\n{reward_error.traceback}", file=sys.stderr, flush=True)
      raise
    message = str(e)
    if isinstance(reward_error, RewardError) and reward_error.timed_out:
      message = message.rstrip(".") + "; --config.data.reward_timeout sets the limit."
    user_error(message)
  return summary


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
