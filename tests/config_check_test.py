"""Tests for experiments.schema.check and the CLI's one-line errors: every field checked when the
config is loaded, unknown keys with close matches, a workdir holding another method's run."""

import dataclasses
import json
import os
import subprocess
import sys

import ml_collections
import pytest
from run_configs import with_fields

from experiments import fields, main
from experiments.configs import base, coverage_study, deepscaler_hard, gsm8k_easy
from experiments.configs import demo as demo_config
from experiments.runners import model_io, run_context
from experiments.schema import check as config_check
from experiments.schema import docs as config_docs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_with = with_fields  # es__sigma sets es.sigma


def test_shipped_configs_pass():
  for config in (
    demo_config.get_config(),
    demo_config.get_config("smoke"),
    gsm8k_easy.get_config(),
    gsm8k_easy.get_config("smoke"),
    deepscaler_hard.get_config(),
    coverage_study.get_config("coverage"),
    base.base_config(),
  ):
    assert config_check.validate(config) is config


@pytest.mark.parametrize(
  "field, value, allowed",
  [
    ("eval.temperature", float("nan"), "finite number >= 0"),
    ("es.learning_rate", float("inf"), "finite number > 0"),
    ("es.temperature", -1.0, ">= 0"),
    ("es.top_p", 0.0, "(0, 1]"),
    ("eval.ks", (0,), "ints >= 1"),
    ("seed", -1, "int >= 0"),
    ("es.shaping", "rank", "centered_rank"),
    ("data.reward", "nope", "reasoning_gym/<task>"),
    ("model.dtype", "fp8", "bfloat16"),
    ("es.arithmetic", "fp16", "bf16_faithful"),
    ("es.master_dtype", "bf16", "float32"),
    ("method", "train", "population_sweep"),
    ("grpo.num_generations", 1, "int >= 2"),
    ("sequential.first_fraction", 1.0, "(0, 1)"),
    ("es.population_size", 0, "int >= 1"),
    ("data.task", "gsm9k", "gsm8k"),
    ("demo.runs", "es,ppo", "grpo_es"),
    ("data.on_bad_row", "ignore", "'skip'"),
    ("eval.on_bad_row", "", "'raise'"),
    ("report.pairs", "ES", "'name:other name' pairs"),
    ("report.out", None, "need a string"),
  ],
)
def test_bad_values_are_refused_naming_the_dotted_field(field, value, allowed):
  config = _with(demo_config.get_config("smoke"), **{field.replace(".", "__"): value})
  with pytest.raises(config_check.ConfigError) as e:
    config_check.validate(config)
  message = str(e.value)
  assert message.startswith(f"config.{field}={value!r} is invalid"), message
  assert allowed in message and "\n" not in message


def test_cross_field_rules():
  smoke = demo_config.get_config("smoke")
  for overrides, name in (
    (dict(es__antithetic=True, es__population_size=5), "config.es.population_size=5"),
    # es_jax.es.noise.NoiseSpec's own rules, naming the config field
    (
      dict(es__master_dtype="", es__arithmetic="bf16_shared_noise", es__rank=4),
      r"config.es.arithmetic='bf16_shared_noise' needs materialised weights; .*\(rank=4\)",
    ),
    (
      dict(es__master_dtype="", es__arithmetic="bf16_tensor_noise", es__optimizer="adam"),
      "config.es.optimizer='adam'",
    ),
    # bf16 arithmetic on float32 masters would be "fp32" in all but name
    (dict(es__arithmetic="bf16_faithful"), "config.es.master_dtype='float32' .* model's dtype"),
    (dict(grpo__mini_batch_size=3), "config.grpo.mini_batch_size=3"),
    (dict(model__source="hf", model__path=""), "config.model.path=''"),
    (dict(es__population_size=6, es__members_per_chunk=4), "config.es.population_size=6"),
    (dict(eval__ks=(1, 64)), r"config.eval.ks=\(1, 64\) .* k=\[64\] is larger"),
    (dict(method="report"), r"^config.report.workdirs is empty: name the run directories"),
    (dict(method="diversity", diversity__checkpoints=True), "config.diversity.checkpoints=True"),
  ):
    with pytest.raises(config_check.ConfigError, match=name):
      config_check.validate(_with(smoke, **overrides))


def test_hash_fallback_is_an_opt_in_reward_name():
  easy = gsm8k_easy.get_config()
  assert easy.data.reward == ""  # the task's own: \\boxed{} answers only
  config = _with(easy, data__reward="gsm8k_hash")
  assert config_check.validate(config) is config
  assert "gsm8k_hash" in config_docs.field_docs()["data.reward"]


@pytest.mark.parametrize(
  "config",
  [demo_config.get_config(), coverage_study.get_config("coverage")],
  ids=["demo", "coverage_study"],
)
def test_model_overrides_are_honoured_or_refused(config):
  """The bundled model (source "default") takes no path, preset or base: refused in one line."""
  assert config.model.source == "default"
  for overrides, expected in (
    (dict(model__path="/models/mine"), "set model.source=hf, gguf or orbax"),
    (dict(model__preset="tiny-llama"), "only model.source='random' uses a preset"),
    (dict(model__base_path="/models/base"), "only model.source='orbax' uses it"),
  ):
    with pytest.raises(config_check.ConfigError) as e:
      config_check.validate(_with(config, **overrides))
    field = next(iter(overrides)).replace("__", ".")
    assert str(e.value).startswith(f"config.{field}=") and expected in str(e.value)
  hf = _with(config, model__source="hf", model__path="/models/mine")
  assert config_check.validate(hf).model.path == "/models/mine"  # honoured: loaded from there


def test_periodic_evaluation_reports_only_the_ks_its_samples_allow():
  from experiments.evaluation import evaluate

  config = demo_config.get_config()  # ks (1, 2, 4, 8), periodic n = 4
  evaluator = object.__new__(evaluate.Evaluator)
  evaluator.config, evaluator.key, evaluator.layout = config.eval, None, {}
  assert evaluator.settings(4).ks == (1, 2, 4)
  assert evaluator.settings(8).ks == (1, 2, 4, 8)


def test_runners_validate_before_loading(monkeypatch):
  def no_loading(*args, **kwargs):
    raise AssertionError("the model was loaded before the config was checked")

  from experiments.runners import es_runner, grpo_runner

  monkeypatch.setattr(model_io, "load_model", no_loading)
  config = _with(demo_config.get_config("smoke"), method="es", es__shaping="bogus")
  with pytest.raises(config_check.ConfigError, match=r"config\.es\.shaping='bogus'"):
    es_runner.run(config, "/nonexistent/workdir")
  config = _with(demo_config.get_config("smoke"), method="grpo", grpo__top_p=0.0)
  with pytest.raises(config_check.ConfigError, match=r"config\.grpo\.top_p=0\.0"):
    grpo_runner.run(config, "/nonexistent/workdir")


def test_unknown_key_names_the_dotted_key_and_close_matches():
  config = demo_config.get_config("smoke")
  message = config_check.unknown_key_message(config, "es.populaton_size")
  assert message.startswith("config.es.populaton_size is not a config field")
  assert "es.population_size" in message
  assert "did you mean seed" in config_check.unknown_key_message(config, "sed")
  listed = config_check.unknown_key_message(config, "es.bogus")
  assert "config.es has" in listed and "sigma" in listed


def test_old_es_precision_is_refused_with_its_translation():
  # es.precision was split into es.master_dtype and es.arithmetic: a config file still setting it
  # (or an override) gets one line naming both fields and how to write each old value.
  smoke = demo_config.get_config("smoke")
  for old, (master, arithmetic) in config_check.ES_PRECISION_SPLIT.items():
    with pytest.raises(config_check.ConfigError) as e:
      config_check.validate(_with(smoke, es__precision=old))
    message = str(e.value)
    assert message.startswith(f"config.es.precision={old!r} is no longer a field"), message
    assert f"set es.master_dtype={master!r}, es.arithmetic={arithmetic!r}" in message
    assert "\n" not in message
    # the translation is a valid config
    config_check.validate(
      _with(smoke, es__master_dtype=master, es__arithmetic=arithmetic, es__rank=0)
    )
  with pytest.raises(config_check.ConfigError, match=r"config\.es\.precision=\['x'\] is no longer"):
    config_check.validate(_with(smoke, es__precision=["x"]))
  message = config_check.unknown_key_message(smoke, "es.precision")
  assert "es.master_dtype" in message and "es.arithmetic" in message and "'bf16' -> ''" in message
  # A checkpoint's trajectory config from before the split reads as today's fields.
  saved = {"seed": 0, "es": {"sigma": 0.1, "precision": "bf16"}}
  assert config_check.split_es_precision(saved) == {
    "seed": 0,
    "es": {"sigma": 0.1, "master_dtype": "", "arithmetic": "fp32"},
  }
  assert saved["es"]["precision"] == "bf16"  # not modified in place
  today = {"es": {"master_dtype": "float32", "arithmetic": "fp32"}}
  assert config_check.split_es_precision(today) == today


def test_resuming_another_methods_workdir_is_refused(tmp_path):
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps({"method": "es"}))
  grpo = _with(demo_config.get_config("smoke"), method="grpo")
  with pytest.raises(config_check.ConfigError, match=r"method='es' run but config.method='grpo'"):
    config_check.check_workdir(grpo, str(tmp_path))
  config_check.check_workdir(_with(grpo, method="es"), str(tmp_path))  # the same method resumes
  config_check.check_workdir(_with(grpo, method="evaluate"), str(tmp_path))  # nothing to resume
  (tmp_path / "checkpoints").rmdir()
  config_check.check_workdir(grpo, str(tmp_path))  # no checkpoint: nothing would be mixed


def test_user_errors_wrap_loading_errors_with_their_field():
  with pytest.raises(config_check.ConfigError, match=r"^config\.data: load_task: boom") as e:
    with config_check.user_errors("config.data"):
      raise ValueError("load_task: boom")
  assert isinstance(e.value.__cause__, ValueError)
  with pytest.raises(KeyError):  # other exceptions (bugs) pass through unchanged
    with config_check.user_errors("config.data"):
      raise KeyError("x")


def test_show_tracebacks_flag_and_env(monkeypatch):
  monkeypatch.delenv("ES_JAX_TRACEBACK", raising=False)
  assert not main.show_tracebacks(["prog", "--config=x.py"])
  assert main.show_tracebacks(["prog", "--verbosity=1"])
  monkeypatch.setenv("ES_JAX_TRACEBACK", "1")
  assert main.show_tracebacks(["prog"])


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  env.pop("XLA_FLAGS", None)
  env.pop("ES_JAX_TRACEBACK", None)
  command = [sys.executable, "-m", "experiments.main", "--workdir=/nonexistent/cli_test", *args]
  # A hang guard only: these runs take seconds, but a loaded machine may stretch them a lot.
  return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # six subprocess runs of experiments.main
def test_cli_user_errors_are_one_line_with_exit_status_2():
  smoke = f"--config={os.path.join(ROOT, 'experiments', 'configs', 'demo.py')}:smoke"
  for args, expected in (
    ((smoke, "--config.es.populaton_size=8"), "error: config.es.populaton_size is not a config"),
    ((smoke, "--config.eval.temperature=nan"), "error: config.eval.temperature=nan is invalid"),
    ((smoke, "--config.es.precision=bf16"), "error: config.es.precision is no longer a field"),
    (("--config=experiments/configs/nope.py",), "error: --config:"),
    (("--config=/etc/passwd",), "error: --config /etc/passwd, line 1: invalid syntax"),
    (("--config=experiments/configs/__init__.py",), "error: --config experiments/configs/__init"),
  ):
    out = _cli(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(expected), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_help_config_shows_every_fields_value_rule_and_help():
  """--help_config (main's help path, as a user runs it): one line per field with its value
  (overrides applied), what its rule allows and its declared help; a line per group with its."""
  demo = f"--config={os.path.join(ROOT, 'experiments', 'configs', 'demo.py')}"
  out = _cli(demo, "--help_config", "--config.es.sigma=0.25")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  sigma = fields.declared()["es.sigma"]
  assert f"  es.sigma = 0.25  [need a finite number > 0]  # {sigma.help}" in lines
  by_name = {ln.split(" = ")[0].strip(): ln for ln in lines if ln.startswith("  ")}
  assert set(by_name) == set(fields.declared())
  for name, field in fields.declared().items():
    assert field.help and by_name[name].endswith(f"  # {field.help}"), name
  for name, group in fields.groups().items():
    assert f"{name}:  # {group.help}" in lines, name


def test_describe_lists_every_key_with_its_rule_and_comment():
  config = demo_config.get_config()
  text = config_docs.describe(config)
  lines = text.splitlines()
  keys = {ln.split(" = ")[0].strip() for ln in lines if ln.startswith("  ")}
  sections = {ln.split(":")[0] for ln in lines if ln and not ln.startswith(" ")}
  assert keys == set(fields.declared()) and sections == set(fields.groups())
  assert "  data.task_config = {'max_digits': 1," in text  # a dict-valued field is one field
  assert "es.population_size" in keys and "seed" in keys and "eval" in sections
  line = next(ln for ln in lines if ln.startswith("  es.population_size = "))
  assert line.endswith("[need an int >= 1]  # N: members per step"), line  # rule and help
  docs = config_docs.field_docs()
  assert docs["eval.every"].startswith("periodic eval every this many steps")
  assert docs["model"].startswith("where the weights come from")  # the group's help


def test_dry_run_loads_everything_and_writes_nothing(tmp_path, monkeypatch):
  from flax import nnx
  from tiny_models import tiny_tokenizer

  from es_jax import models

  loaded = []

  def tiny_model(model_config, *, seed=0):  # the bundled tokenizer's 49k vocabulary is slow here
    loaded.append(model_config.preset)
    cfg = dataclasses.replace(models.get_config(model_config.preset), vocab_size=256)
    return models.Transformer(cfg, rngs=nnx.Rngs(seed)), tiny_tokenizer()

  monkeypatch.setattr(model_io, "load_model", tiny_model)
  workdir = tmp_path / "run"
  summary = main.dry_run(_with(demo_config.get_config("smoke"), method="es"), str(workdir))
  assert loaded == ["tiny-llama"] and summary["dry_run"] is True
  assert summary["model_parameters"] > 0 and summary["mesh"] == {"pop": 1, "model": 1}
  assert summary["train_examples"] == 16 and summary["eval_problems"] == 4
  # The planned work: smoke ES 3 steps x N = 4 x 2 prompts; periodic evaluations (every 2) of
  # 2 problems x (2 samples + greedy) before training and after step 2; the final one 4 x 3.
  plan = summary["planned_work"]
  assert plan["completions"] == {
    "base model periodic evaluation": 6,
    "es": 24,
    "es periodic evaluations": 6,
    "final evaluation": 12,
  }
  assert plan["completions_total"] == 48 and "2-core CPU" in plan["cpu_estimate"]
  assert not workdir.exists()  # nothing trained, no file written
  # method=evaluate (a checkpoint's evaluation) reads no training pool, as evaluate.run: the Hard
  # config's DeepScaleR files are not needed.
  hard = deepscaler_hard.get_config("smoke")
  evaluate_only = _with(
    hard, method="evaluate", data__source_dir=str(tmp_path / "none"), data__task="deepscaler"
  )
  summary = main.dry_run(evaluate_only, str(workdir))
  assert summary["method"] == "evaluate" and summary["train_examples"] == 0
  assert summary["eval_problems"] == hard.eval.limit and not workdir.exists()
  with pytest.raises(config_check.ConfigError, match="config.data"):  # training still needs it
    main.dry_run(_with(evaluate_only, method="es"), str(workdir))


def test_population_not_divisible_over_all_devices_is_refused_before_loading(monkeypatch):
  def no_loading(*args, **kwargs):
    raise AssertionError("the model was loaded before the population was checked")

  monkeypatch.setattr(model_io, "load_model", no_loading)
  # mesh.pop=0: every device (8 fake CPU devices in tests) takes members; 4 x 1 cannot be split.
  config = _with(demo_config.get_config("smoke"), method="es", mesh__pop=0, es__members_per_chunk=1)
  with pytest.raises(
    config_check.ConfigError, match=r"config\.es\.population_size=4 .*\(8 devices"
  ):
    run_context.make_context(config, "/nonexistent/workdir")


def test_resuming_another_methods_checkpoints_without_config_json_is_one_line(tmp_path):
  """config.json gone: the checkpoint's own meta names the method that wrote it."""
  import types

  import jax.numpy as jnp

  from es_jax.persist.checkpoint import Checkpointer
  from experiments.runners import train_loop

  ckpt_dir = tmp_path / "checkpoints"
  es_state = {"params": {"w": jnp.ones((2,))}, "opt_state": {"mu": jnp.zeros((2,))}}
  with Checkpointer(ckpt_dir, async_save=False) as ckpt:
    ckpt.save(1, state=es_state, meta={"stage": "es"}, force=True)
  assert not (tmp_path / "config.json").exists()
  config = _with(demo_config.get_config("smoke"), method="grpo")
  config_check.check_workdir(config, str(tmp_path))  # nothing to read there
  ctx = types.SimpleNamespace(config=config, workdir=str(tmp_path))
  grpo_state = {"params": {"w": jnp.ones((2,))}, "opt_state": [jnp.zeros((2,))], "step": 0}
  stage = train_loop.Stage("grpo", 3, str(ckpt_dir))
  with pytest.raises(config_check.ConfigError) as e:
    train_loop.Loop(ctx, stage, grpo_state)
  message = str(e.value)
  assert (
    message.startswith(f"{tmp_path} holds checkpoints of a method='es' run") and "\n" not in message
  )
  assert "--config.method=es" in message


def test_printed_config_shows_only_the_groups_the_method_reads():
  groups = {k for k, v in base.base_config().items() if isinstance(v, ml_collections.ConfigDict)}
  assert set(base.METHOD_GROUPS) == set(base.METHODS)
  assert all(set(used) <= groups for used in base.METHOD_GROUPS.values())

  def shown(**overrides):
    c = base.base_config()
    c.update(overrides)
    lines = config_check.compact(c).splitlines()
    assert lines[0].startswith("config: ") and " method=" in lines[0]  # top-level fields: always
    return {ln.split(":")[0].strip() for ln in lines[1:]}

  training = {"model", "data", "eval", "checkpoint", "mesh", "decode"}
  assert shown(method="es") == {*training, "es"}
  assert shown(method="grpo") == {*training, "grpo"}
  assert shown(method="evaluate") == {"model", "eval", "decode"}
  file_eval = base.base_config()
  file_eval.method, file_eval.eval.task = "evaluate", "file"  # its fields and reward: data's
  assert {ln.split(":")[0].strip() for ln in config_check.compact(file_eval).splitlines()[1:]} == {
    "model",
    "eval",
    "decode",
    "data",
  }
  assert shown(method="fair_study") >= {"es", "grpo", "fair", "diversity", "demo"}
  assert "population_sweep" not in shown(method="demo")


def test_a_config_is_checked_once_and_again_when_changed(monkeypatch):
  """validate remembers a config that passed by its content: main's call and the runner's cost
  one check; a changed config is checked again."""
  from experiments.schema import rules as config_rules

  calls = []
  real = config_rules.cross_checks
  monkeypatch.setattr(config_rules, "cross_checks", lambda c: calls.append(1) or real(c))
  config = _with(demo_config.get_config("smoke"), seed=12345)  # content no other test validates
  assert config_check.validate(config) is config
  assert config_check.validate(config) is config
  assert len(calls) == 1
  bad = _with(config, es__sigma=float("nan"))
  for _ in range(2):  # a refused config is never remembered
    with pytest.raises(config_check.ConfigError, match=r"config\.es\.sigma=nan is invalid"):
      config_check.validate(bad)


def test_runners_read_the_allowed_names_from_the_config_layer():
  """demo.RUNS and the schema's demo.runs are the same names (one declaration, in choices)."""
  from experiments.configs import choices
  from experiments.studies import demo

  assert tuple(demo.RUNS) == tuple(choices.DEMO_RUNS)
  assert all(demo.RUNS[n][0] == choices.DEMO_RUNS[n][0] for n in demo.RUNS)
  for name in choices.DEMO_RUNS:
    assert config_check.schema()["demo.runs"](name) is None
  assert config_check.schema()["demo.runs"]("es,ppo") is not None
  for order in choices.SEQUENTIAL_ORDERS:
    assert config_check.schema()["sequential.order"](order) is None
