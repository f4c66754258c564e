"""Which params each stage of a sequential schedule starts from and anchors its KL to."""

import types

import pytest

from experiments.configs import demo
from experiments.runners import run_context, sequential, train_loop
from tests.run_configs import smoke_config


@pytest.fixture
def recorded(monkeypatch, tmp_path):
  """sequential.run with context, trainers and finish replaced by recorders (no model)."""
  calls = []
  base, after = object(), {}

  def make_context(config, workdir):
    return types.SimpleNamespace(base_params=base, workdir=str(tmp_path), config=config)

  def trainer(name):
    def train(ctx, params, stage, **kw):
      calls.append((name, params, kw.get("ref_params")))
      after[name] = object()
      return train_loop.StageResult(after[name], True)

    return train

  monkeypatch.setattr(run_context, "make_context", make_context)
  monkeypatch.setattr(train_loop, "finish", lambda ctx, params, stopped: {"params": params})
  monkeypatch.setattr(sequential, "TRAINERS", {"es": trainer("es"), "grpo": trainer("grpo")})
  return calls, base, after


@pytest.mark.parametrize("reference", ["base", "stage1"])
def test_es_then_grpo_kl_reference(recorded, reference, tmp_path):
  calls, base, after = recorded
  config = smoke_config(
    demo, method="sequential", sequential__order="es_grpo", sequential__kl_reference=reference
  )
  out = sequential.run(config, str(tmp_path))
  assert [c[0] for c in calls] == ["es", "grpo"]
  assert calls[0][1] is base and calls[1][1] is after["es"]  # stage two starts from stage one
  expected = after["es"] if reference == "stage1" else None  # None: the runner uses the base
  assert calls[1][2] is expected
  assert out["params"] is after["grpo"]


def test_grpo_then_es_passes_no_reference_and_bad_value_is_refused(recorded, tmp_path):
  calls, base, _ = recorded
  sequential.run(smoke_config(demo, method="sequential", sequential__order="grpo_es"), "x")
  assert [(c[0], c[2]) for c in calls] == [("grpo", None), ("es", None)]
  bad = smoke_config(demo, method="sequential", sequential__kl_reference="stage2")
  with pytest.raises(ValueError, match="sequential.kl_reference"):
    sequential.run(bad, str(tmp_path))
