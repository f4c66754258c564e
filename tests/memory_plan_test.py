"""es_jax.devices.memory_plan against compiled TPU figures (docs/tpu_plan.md, "Calibration"), and
the runners' memory check. Pure Python: no libtpu, no compile."""

import dataclasses

import pytest

from es_jax import models
from es_jax.devices import memory_plan
from experiments.runners import run_context
from experiments.tpu import memory_check
from experiments.tpu import programs as tpu_programs

CONFIG = "experiments/configs/gsm8k_easy.py"
# (topology, preset, program, overrides, compiled temp bytes, compiled total bytes): per chip,
# `compiled.memory_analysis()` of experiments.tpu.plan's programs (total = args + out - alias +
# temp, code left out), libtpu 0.0.42.1, 2026-12-04. 1.5B rows are GiB figures rounded to 0.01.
_G = 2**30
_05 = "qwen2.5-0.5b"
_15 = "qwen2.5-1.5b"
_R1 = "deepseek-r1-distill-qwen-1.5b"
_HARD = "experiments/configs/deepscaler_hard.py"  # a leading config file replaces CONFIG
_SMALL = ["--config.data.prompts_per_step=16", "--config.es.max_new_tokens=512"]
_M4 = ["--config.mesh.model=4", "--config.mesh.pop=2"]
_GRPO = ["--config.method=grpo", *_M4, "--config.data.prompts_per_step=16"]
CASES = [
  ("v5e:2x4", _05, "eval", ["--config.eval.max_new_tokens=512"], 2653888000, 3642463232),
  ("v5e:2x4", _05, "es_population", _SMALL, 2755806208, 3744323072),
  ("v5e:2x4", _05, "es_population", [*_SMALL, "--config.es.members_per_chunk=2"], 4323378688,
   5311895552),
  ("v5e:2x4", _05, "es_population", [*_M4, *_SMALL], 1749554688, 1998413824),
  ("v5e:2x4", _05, "es_update", [], 1091565568, 2079632896),
  ("v5e:2x4", _05, "es_update", _M4, 1677204480, 1924330496),
  ("v5e:2x4", _05, "grpo_update", [*_GRPO, "--config.grpo.max_new_tokens=512",
   "--config.grpo.mini_batch_size=64", "--config.grpo.remat=False"], 3493617152, 5223791104),
  ("v5e:2x4", _15, "es_population", [], 13.63 * _G, 16.52 * _G),
  ("v6e:2x4", _15, "es_population", [], 14.95 * _G, 17.84 * _G),
  ("v5e:2x4", _15, "es_population", ["--config.es.max_new_tokens=1024"], 11.92 * _G, 14.80 * _G),
  ("v6e:2x4", _15, "es_population", _M4, 13.44 * _G, 14.19 * _G),
  ("v5e:2x4", _15, "eval", [], 7.94 * _G, 10.82 * _G),
  ("v5e:2x4", _15, "es_update", [], 2.87 * _G, 5.75 * _G),
  ("v6e:2x4", _15, "es_update", [], 4.31 * _G, 7.19 * _G),
  # grpo.remat=True (the paper configs' setting), float32 masters unless named.
  ("v5e:2x4", _05, "grpo_update", [*_GRPO, "--config.grpo.max_new_tokens=512",
   "--config.grpo.mini_batch_size=64"], 1327856128, 3091844608),
  ("v6e:2x4", _15, "grpo_update", ["--config.method=grpo", *_M4], 4722327040, 10179493632),
  ("v6e:2x4", _15, "grpo_update", ["--config.method=grpo", "--config.grpo.master_dtype=bfloat16"],
   15.37 * _G, 26.87 * _G),
  ("v5p:2x2x2", _R1, "grpo_update", [_HARD, "--config.method=grpo"], 28877182976, 53811243776),
]  # fmt: skip


def _predict(topology, preset, program, overrides):
  path = CONFIG
  if overrides and overrides[0].endswith(".py"):
    path, overrides = overrides[0], overrides[1:]
  config = tpu_programs.load_config(path, overrides)
  model = int(config.mesh.model)
  pop = int(config.mesh.pop) or 8 // model  # the topologies above have 8 devices
  return memory_check.predict(
    program,
    config,
    models.get_config(preset),
    pop=pop,
    model=model,
    prompt_len=256,
    chip=topology.split(":")[0],
  )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{len(c[3])}")
def test_prediction_within_15_percent_of_compiled(case):
  topology, preset, program, overrides, temp, total = case
  est = _predict(topology, preset, program, overrides)
  assert 0.85 <= est.temp / temp <= 1.15, (est.temp / _G, temp / _G)
  assert 0.85 <= est.total / total <= 1.15, (est.total / _G, total / _G)


def test_at_least_four_cases_at_full_size_and_ten_in_all():
  assert len(CASES) >= 10 and sum(c[1] == _15 for c in CASES) >= 4


@dataclasses.dataclass
class _FakeDevice:
  platform: str = "tpu"
  device_kind: str = "TPU v5 lite"
  limit: int = 0

  def memory_stats(self):
    return {"bytes_limit": self.limit} if self.limit else None


class _Mesh:
  shape = {"pop": 8, "model": 1}


def _easy(*overrides):
  return tpu_programs.load_config(CONFIG, list(overrides))


def test_runner_refuses_a_config_that_cannot_fit_on_tpu():
  cfg = models.get_config(_15)
  config = _easy("--config.es.members_per_chunk=4")
  with pytest.raises(ValueError, match=r"es_population .*TPU v5e has 16\.0 GiB.*es\.members_per"):
    run_context.check_memory(config, cfg, _Mesh(), devices=[_FakeDevice()])
  # The runtime's own limit wins over the published size.
  with pytest.raises(ValueError, match=r"has 8\.0 GiB"):
    run_context.check_memory(_easy(), cfg, _Mesh(), devices=[_FakeDevice(limit=8 * _G)])
  run_context.check_memory(_easy(), cfg, _Mesh(), devices=[_FakeDevice(device_kind="TPU v6 lite")])


def test_the_paper_grpo_meshes_pass_the_check_and_the_refused_one_is_refused():
  # Compiled (CASES): Easy GRPO fits a v6e:2x4 with model=4 (9.5 GiB), while replicated over 'pop'
  # with float32 masters the compiler refuses it; Hard GRPO fits v5p:2x2x2 replicated (50 GiB).
  cfg = models.get_config(_15)
  v6e = [_FakeDevice(device_kind="TPU v6 lite")]

  class M4:
    shape = {"pop": 2, "model": 4}

  run_context.check_memory(_easy("--config.method=grpo", *_M4), cfg, M4(), devices=v6e)
  with pytest.raises(ValueError, match=r"grpo_update .*TPU v6e has 32\.0 GiB"):
    run_context.check_memory(_easy("--config.method=grpo"), cfg, _Mesh(), devices=v6e)
  hard = tpu_programs.load_config(_HARD, ["--config.method=grpo"])
  v5p = [_FakeDevice(device_kind="TPU v5p")]
  run_context.check_memory(hard, models.get_config(_R1), _Mesh(), devices=v5p)


def test_memory_check_is_skipped_off_tpu_or_when_disabled():
  cfg = models.get_config(_15)
  config = _easy("--config.es.members_per_chunk=4")
  run_context.check_memory(config, cfg, _Mesh(), devices=[_FakeDevice(platform="cpu")])
  run_context.check_memory(config, cfg, _Mesh(), devices=[_FakeDevice(device_kind="TPU v99")])
  off = _easy("--config.es.members_per_chunk=4", "--config.mesh.check_memory=False")
  run_context.check_memory(off, cfg, _Mesh(), devices=[_FakeDevice()])


def test_chip_for_device_kinds():
  assert memory_plan.chip_for_device(_FakeDevice(device_kind="TPU v6 lite")).kind == "v6e"
  assert memory_plan.chip_for_device(_FakeDevice(device_kind="TPU v4")).kind == "v4"
  assert memory_plan.chip_for_device(_FakeDevice(device_kind="cpu")) is None
