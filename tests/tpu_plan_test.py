"""experiments.tpu.plan: tiny models compile for TPU topologies on this CPU host (needs libtpu)."""

import os
import re

import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
pytest.importorskip(
  "libtpu", reason="libtpu not installed: `make test` installs it (the tpu extra)"
)

import jax  # noqa: E402

from es_jax import models  # noqa: E402
from es_jax.decode import sampling  # noqa: E402
from es_jax.devices import memory_plan  # noqa: E402
from experiments.tpu import memory_check  # noqa: E402
from experiments.tpu import plan as tpu_plan
from experiments.tpu import programs as tpu_programs

CONFIG = "experiments/configs/gsm8k_easy.py:smoke"


def _config(population_size):
  return tpu_programs.load_config(
    CONFIG,
    [
      "--config.method=sequential",
      "--config.mesh.pop=0",  # every device of the topology
      f"--config.es.population_size={population_size}",
      "--config.data.prompts_per_step=4",
      "--config.grpo.micro_batch_size=1",
    ],
  )


def test_a_small_program_compiles_for_a_small_topology():
  """The quick tier's TPU check: one program (the ES update) for 4 v5e chips."""
  (result,) = tpu_plan.plan(_config(8), "v5e:2x2", programs=("es_update",), step_cost=False)
  assert result["program"] == "es_update" and not result.get("error"), result
  assert result["fits"] and result["total"] > 0 and result["code"] > 0, result
  assert jax.default_backend() == "cpu"


# Every program of a sequential run, for the 8 devices of a v4 slice (the quick tier's test above
# compiles one for v5e: the same planner path on another chip table entry).
@pytest.mark.slow  # about half a minute of compiling
def test_every_program_compiles_for_tpu():
  results = tpu_plan.plan(_config(16), "v4:2x2x1", step_cost=False)
  assert [r["program"] for r in results] == list(tpu_plan.PROGRAMS["sequential"])
  for r in results:
    assert not r.get("error"), r
    assert r["fits"] and r["total"] > 0 and r["code"] > 0, r
    assert r["settings"]["pop"] == 8
  assert tpu_plan.exit_code(results) == tpu_plan.EXIT_FITS
  assert jax.default_backend() == "cpu"  # compiling for TPU leaves the host backend alone


def test_layer_layout_follows_the_target_devices():
  devices = tpu_programs.topology_devices("v5e:2x2")
  assert not sampling.default_unroll_layers(tpu_programs.make_mesh(devices, 4, 1))
  assert sampling.default_unroll_layers(jax.devices()) and sampling.default_unroll_layers()


def test_bad_input_is_one_line_naming_the_field(capsys):
  code = tpu_plan.main(["--config", CONFIG, "--topology", "v5e:2x2", "--config.es.rankk=4"])
  assert code == tpu_plan.EXIT_BAD_INPUT
  assert "config.es.rankk" in capsys.readouterr().err
  assert tpu_plan.main(["--config", CONFIG, "--topology", "v9:2x2"]) == tpu_plan.EXIT_BAD_INPUT


def test_check_fits_names_the_setting():
  cfg = models.get_config("qwen2.5-1.5b")
  config = tpu_programs.load_config("experiments/configs/gsm8k_easy.py", [])
  chip = memory_plan.CHIPS["v5e"]
  config.es.members_per_chunk = 4
  small = memory_check.predict("es_population", config, cfg, pop=8, model=1, prompt_len=256)
  config.es.members_per_chunk = 1
  smaller = memory_check.predict("es_population", config, cfg, pop=8, model=1, prompt_len=256)
  assert smaller.total < small.total
  config.es.members_per_chunk = 4
  with pytest.raises(ValueError, match="es.members_per_chunk"):
    memory_check.check_config_fits(config, cfg, chip, programs=("es_population",), pop=8)


def test_verdict_fits_tight_when_over_nominal_hbm_but_compiled():
  chip = memory_plan.CHIPS["v5e"]
  base = {"program": "es_population", "argument": 3 * 2**30, "output": 0, "alias": 0, "code": 0}
  ok = tpu_plan.verdict({**base, "temp": 10 * 2**30, "total": 13 * 2**30}, chip)
  assert ok["fits"] and not ok["tight"] and ok["verdict"] == "fits"
  tight = tpu_plan.verdict({**base, "temp": 13.6 * 2**30, "total": 16.6 * 2**30}, chip)
  assert tight["fits"] and tight["tight"] and tight["verdict"].startswith("fits (tight)")
  refused = {"program": "es_population", "error": "RESOURCE_EXHAUSTED", "too_big": True}
  no = tpu_plan.verdict(refused, chip)
  assert not no["fits"] and "es.members_per_chunk" in no["verdict"]
  assert tpu_plan.exit_code([tight]) == tpu_plan.EXIT_FITS
  assert tpu_plan.exit_code([tight, no]) == tpu_plan.EXIT_TOO_BIG


def test_decode_cost_c_prints_the_step_and_the_instruments_floor(capsys):
  from experiments.benchmarks import decode_cost

  decode_cost.main(["--model", "tiny", "--step_rows", "4", "--budget", "256", "--skip", "a,b"])
  out = capsys.readouterr().out
  steps = re.findall(r"\(c\) one step.*?(bucketed|dense): bytes accessed .*?5% (\d+) MiB", out)
  assert [kind for kind, _ in steps] == ["bucketed", "dense"], out
  floor = re.search(r"matmul (\d+\.\d+)x its weight's bytes \((\d+\.\d+)x at 1 row\)", out)
  assert floor and float(floor.group(1)) > 0 and float(floor.group(2)) > 0, out
  assert re.search(r"a lookup of 4 tokens \d+\.\d+x the whole", out), out
