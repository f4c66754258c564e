"""No stale state in study stages: a calibration's partial rows and a fair study's stages are
reused only under the config they were measured under; otherwise refused (changing no file)."""

import json
import os

import pytest
from run_configs import smoke_config

from experiments.configs import fair_study as fair_config
from experiments.schema.errors import ConfigError
from experiments.studies import calibration, fair_study
from experiments.studies import stages as study_stages


def _files(root):
  """{path: bytes} of every file under `root`."""
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      with open(os.path.join(d, n), "rb") as f:
        out[os.path.join(d, n)] = f.read()
  return out


def _plant_partial(workdir, config, rows):
  out = workdir / "calibration"
  out.mkdir(parents=True)
  record = study_stages.fields(config, "calibration")
  (out / "rows.partial.json").write_text(json.dumps({"config": record, "rows": rows}))


def test_partial_calibration_of_another_seed_is_refused_and_left_as_it_was(tmp_path):
  row = {"sigma": 1e-3, "members": 999, "fitness_mean": 42.0, "changed": 1.0}
  _plant_partial(tmp_path, smoke_config(fair_config, method="calibrate"), [row])
  before = _files(tmp_path)
  config = smoke_config(fair_config, method="calibrate", seed=1)
  with pytest.raises(ConfigError, match=r"seed \(0 then, 1 now\).*diversity.restart=True"):
    calibration.run(config, str(tmp_path))
  assert _files(tmp_path) == before
  # A partial file from before configs were recorded (a bare list of rows) is refused too.
  (tmp_path / "calibration" / "rows.partial.json").write_text(json.dumps([row]))
  with pytest.raises(ConfigError, match="no recorded config"):
    calibration.run(config, str(tmp_path))


@pytest.mark.slow  # a whole calibration run
def test_restart_measures_every_sigma_again(tmp_path):
  row = {"sigma": 1e-3, "members": 999, "fitness_mean": 42.0, "changed": 1.0}
  config = smoke_config(fair_config, method="calibrate", diversity__sigmas=(1e-3,))
  _plant_partial(tmp_path, smoke_config(fair_config, method="calibrate", seed=1), [row])
  config = smoke_config(
    fair_config, method="calibrate", diversity__sigmas=(1e-3,), diversity__restart=True
  )
  calibration.run(config, str(tmp_path))
  table = json.load(open(tmp_path / "calibration" / "table.json"))
  assert [r["members"] for r in table["rows"]] == [4]  # measured: the smoke population
  partial = json.load(open(tmp_path / "calibration" / "rows.partial.json"))
  assert partial["config"]["seed"] == 0


def test_planted_fair_study_stages_are_refused_before_anything_runs(tmp_path):
  config = smoke_config(fair_config)
  table = tmp_path / "calibration" / "calibration" / "table.json"
  table.parent.mkdir(parents=True)
  table.write_text(json.dumps({"recommended_sigma": 123.0, "rows": []}))
  before = _files(tmp_path)
  with pytest.raises(ConfigError, match="without stage_config.json.*fair.redo=calibration"):
    fair_study.run(config, str(tmp_path))
  assert _files(tmp_path) == before
  # Recorded under another config: the differing field is named.
  other = smoke_config(fair_config, fair__pilot_steps=5)
  for stage in ("calibration", "pilots"):
    os.makedirs(tmp_path / stage, exist_ok=True)
    record = study_stages.fields(other if stage == "pilots" else config, stage)
    (tmp_path / stage / "stage_config.json").write_text(json.dumps(record))
  before = _files(tmp_path)
  with pytest.raises(ConfigError, match=r"pilots was measured.*fair.pilot_steps \(5 then"):
    fair_study.run(config, str(tmp_path))
  assert _files(tmp_path) == before
  # A later stage with results while an earlier one has none came from another study.
  os.remove(tmp_path / "calibration" / "stage_config.json")
  os.remove(table)
  os.rmdir(table.parent)
  with pytest.raises(ConfigError, match="earlier stage calibration has none"):
    fair_study.run(config, str(tmp_path))


def test_redo_starts_the_named_stage_and_every_later_one_over(tmp_path):
  config = smoke_config(fair_config, fair__redo="pilots")
  assert study_stages.redo_list(config) == ["pilots", "runs", "diversity"]
  assert study_stages.redo_list(smoke_config(fair_config)) == []
  records = {s: study_stages.fields(config, s) for s in ("calibration", "pilots")}
  (tmp_path / "pilots").mkdir()
  (tmp_path / "pilots" / "choice.json").write_text("{}")  # no record: refused unless redone
  with pytest.raises(ConfigError):
    study_stages.check_all(str(tmp_path), records, [])
  study_stages.check_all(str(tmp_path), records, ["pilots"])
  out = study_stages.start(str(tmp_path), "pilots", records["pilots"], ["pilots"])
  assert os.listdir(out) == ["stage_config.json"]
  assert json.load(open(os.path.join(out, "stage_config.json"))) == records["pilots"]
