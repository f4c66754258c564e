"""Study v2's decision rules and seed combination on hand-made per-problem results."""

import numpy as np
import pytest

from experiments.studies import rules as study_rules
from experiments.studies import seeds as study_seeds


def _run(pass1, pass16, greedy=None):
  """Per-problem values of 8 problems with Pass@1, Pass@16 and Pass@32 (= Pass@16 + 0.1)."""
  pass1, pass16 = np.asarray(pass1, float), np.asarray(pass16, float)
  return {
    "index": np.arange(8),
    "greedy": np.asarray(greedy if greedy is not None else pass1 > 0.5, float),
    "pass@1": pass1,
    "pass@16": pass16,
    "pass@32": np.minimum(pass16 + 0.1, 1.0),
  }


BASE = _run([0.1, 0.2, 0.1, 0.3, 0.2, 0.1, 0.2, 0.1], [0.5, 0.6, 0.4, 0.7, 0.6, 0.5, 0.6, 0.4])


def test_paired_difference_and_standard_error():
  a = _run(BASE["pass@1"] + np.array([0.1, 0.3, 0.1, 0.3, 0.1, 0.3, 0.1, 0.3]), BASE["pass@16"])
  mean, se = study_rules.paired(a, BASE, "pass@1")
  d = np.array([0.1, 0.3] * 4)
  assert mean == pytest.approx(0.2) and se == pytest.approx(d.std(ddof=1) / np.sqrt(8))
  other = {**a, "index": np.arange(1, 9)}
  with pytest.raises(ValueError, match="other problems"):
    study_rules.paired(other, BASE, "pass@1")


def test_rules_fire_on_results_that_meet_them_and_not_otherwise():
  # ES: Pass@1 up by 0.2 ± ~0.02, Pass@16 up by more (grows with k); GRPO: Pass@1 up, Pass@32
  # down (narrows), below ES at k = 16 and 32 on every problem.
  es = _run(BASE["pass@1"] + 0.2 + 0.01 * np.arange(8) % 0.03, BASE["pass@16"] + 0.3)
  grpo = _run(BASE["pass@1"] + 0.3, BASE["pass@16"] - 0.2)
  flat = _run(BASE["pass@1"] + 0.01 * (np.arange(8) % 2 - 0.5), BASE["pass@16"])
  per = {"base": BASE, "ES": es, "ES flat": flat, "GRPO": grpo}
  rows = study_rules.evaluate(per, ["ES", "ES flat"], {"ES": 0.01, "ES flat": 0.02})
  fired = {(r["rule"], r["arm"]) for r in rows if r["fired"]}
  # The flat arm moves nothing, but GRPO's narrowing puts it above GRPO at large k.
  expected = {("moves", "ES"), ("mechanism", "ES"), ("beats_grpo", "ES"), ("narrows", "GRPO")}
  # Constant differences from GRPO at Pass@16: the SE target is met for both.
  expected |= {("se_target", "ES"), ("se_target", "ES flat")}
  assert fired == expected | {("beats_grpo", "ES flat")}
  # JS_succ's interval touching zero (or not measured) withholds only the mechanism.
  rows = study_rules.evaluate(per, ["ES"], {"ES": 0.0})
  assert {r["rule"] for r in rows if r["fired"]} == {"moves", "beats_grpo", "narrows", "se_target"}
  noisy = _run(BASE["pass@1"], BASE["pass@16"] + 0.3 * (np.arange(8) % 2))
  assert not study_rules.se_target(noisy, grpo)[0]  # SE 0.056 > 0.03
  assert not study_rules.mechanism(es, BASE, None)[0]
  # Pass@16 significantly lower: sampled Pass@1 moved (the extension rule) but not `moves`.
  sharp = _run(BASE["pass@1"] + 0.2, BASE["pass@16"] - 0.3 - 0.01 * (np.arange(8) % 2))
  assert study_rules.extend(sharp, BASE)[0] and not study_rules.moves(sharp, BASE)[0]
  lines = study_rules.markdown(rows, "abc1234")
  assert "commit abc1234" in "\n".join(lines)
  assert "| ES moves sampled behaviour | ES | **yes** |" in "\n".join(lines)


def test_seeds_are_combined_with_their_spread():
  one = _run(BASE["pass@1"] + 0.1, BASE["pass@16"])
  two = _run(BASE["pass@1"] + 0.3, BASE["pass@16"])
  c = study_seeds.combine([one, two], BASE, "pass@1")
  assert c["deltas"] == pytest.approx([0.1, 0.3]) and c["mean"] == pytest.approx(0.2)
  assert c["spread"] == pytest.approx(0.2) and c["ses"] == pytest.approx([0.0, 0.0], abs=1e-12)
  lines = study_seeds.markdown({"ES": [one, two], "GRPO": [one]}, BASE)
  text = "\n".join(lines)
  assert "| ES | pass@1 | +0.1000 ± 0.0000, +0.3000 ± 0.0000 | +0.2000 | 0.2000 |" in text
  assert "| GRPO |" not in text  # one seed: nothing to combine
  assert study_seeds.markdown({"GRPO": [one]}, BASE) == []
