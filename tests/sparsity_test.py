"""experiments.studies.sparsity on a random tiny model with a hand-made update of known sizes."""

import json
import math

import jax
import jax.numpy as jnp
import pytest
from ml_collections import ConfigDict

from es_jax import models
from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import demo as demo_config
from experiments.runners import model_io
from experiments.studies import sparsity


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("sparsity")
  c = ConfigDict(demo_config.get_config("smoke").to_dict())
  c.method, c.progress = "sparsity", False
  c.sparsity.taus = (1e-9, 1e-3, 1e9)
  model, _ = model_io.load_model(c.model, seed=c.seed)
  base = models.params(model)
  # embed moves by 5e-4 (reset at τ = 1e-3), everything else by 2e-3 (kept).
  tuned = {
    k: jax.tree.map(lambda x, d=5e-4 if k == "embed" else 2e-3: x + d, v) for k, v in base.items()
  }
  with Checkpointer(tmp / "run" / "checkpoints", async_save=False) as ckpt:
    ckpt.save(3, state={"params": tuned, "opt_state": {"count": jnp.zeros([], jnp.int32)}})
  # An ES run's files: the null-walk prediction reads α, N and the steps whose fitness varied.
  es = {"learning_rate": 1e-3, "population_size": 4, "optimizer": "sgd"}
  (tmp / "run" / "config.json").write_text(json.dumps({"method": "es", "es": es}))
  lines = [{"step": s, "fitness/std": v} for s, v in ((0, 1.0), (1, 0.5), (2, 0.0), (3, 0.2))]
  (tmp / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  c.sparsity.tuned = str(tmp / "run")
  c.lock()
  result = sparsity.run(c, str(tmp / "out"))
  return base, tuned, result, tmp / "out"


@pytest.mark.slow
def test_sparsity_fractions_and_thresholded_evaluations(setup):
  base, tuned, result, out = setup
  rows = {r["model"]: r for r in result["rows"]}
  n_embed = base["embed"].size
  n_all = sum(x.size for x in jax.tree.leaves(base))
  assert rows["tau=0.001"]["sparsity"] == pytest.approx(n_embed / n_all, rel=1e-6)
  assert rows["tau=1e-09"]["sparsity"] == 0.0 and rows["tau=1e+09"]["sparsity"] == 1.0
  # Resetting nothing evaluates like the tuned model; resetting everything like the base.
  for k in ("greedy", "pass@1", "mean_length", "mean_entropy"):
    assert rows["tau=1e-09"][k] == pytest.approx(rows["tuned"][k])
    assert rows["tau=1e+09"][k] == pytest.approx(rows["base"][k])
  assert result["drift"] > 0 and result["changed_fraction"] == pytest.approx(1.0)
  # The largest updates (2e-3) are everywhere but in embed.
  assert result["groups"]["embed"]["top"] == 0.0
  assert sum(g["params"] for g in result["groups"].values()) == pytest.approx(1.0)
  # Two of the three training steps moved (step 2's fitness was constant).
  norm = math.sqrt(sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(base)))
  want = 1e-3 * math.sqrt(n_all * 2 / 4) / norm
  assert result["null_walk"]["steps_moved"] == 2
  assert result["null_walk"]["predicted_null"] == pytest.approx(want, rel=1e-5)
  saved = json.loads((out / "sparsity.json").read_text())
  assert len(saved["rows"]) == 5
  assert "| tau=0.001 |" in (out / "sparsity.md").read_text()
  assert "without signal would have" in (out / "sparsity.md").read_text()
  assert (out / "sparsity.png").stat().st_size > 1000


def test_bad_tuned_path_is_named(tmp_path):
  with pytest.raises(ValueError, match="sparsity.tuned"):
    sparsity.load_tuned(str(tmp_path / "missing"), models.get_config("tiny-llama"))
