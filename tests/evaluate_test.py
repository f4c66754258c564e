"""Evaluation runner (experiments/evaluation/evaluate.py) on a tiny random model and the tiny
tokenizer."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from run_configs import smoke_config, with_fields
from tiny_models import tiny_tokenizer

from es_jax import data, models
from es_jax.decode.sampling import Decoding, encode_prompts, generate
from es_jax.metrics import maj_at_k, pass_at_k
from es_jax.persist import checkpoint
from experiments.configs import demo as demo_config
from experiments.evaluation import evaluate
from experiments.evaluation import results as eval_results
from experiments.evaluation.tasks import TaskSpec
from experiments.runners import model_io, run_data
from experiments.schema.errors import ConfigError

N, BATCH, NEW_TOKENS = 4, 8, 8
SETTINGS = dict(num_samples=N, batch_size=BATCH, max_new_tokens=NEW_TOKENS, temperature=1.0)
KEEP = 4  # problems whose completions go to toy.samples.jsonl


@pytest.fixture(scope="module")
def tiny():
  model = models.Transformer(models.get_config("tiny-llama"), rngs=nnx.Rngs(0))
  return model, tiny_tokenizer()


def toy_examples(count=10):
  return [
    {"id": f"toy-{i}", "task": "toy", "prompt": f"Add {i} and 12.", "answer": "x"}
    for i in range(count)
  ]


def toy_correct(text, example):
  """About half the random completions count as correct, so the counts are not all 0 or n."""
  return len(text.encode()) % 2 == 0


def toy_answer(text):
  return text[:1] or None


def run_toy(model, tok, examples, out_dir=None, on_problem=None, **kwargs):
  """evaluate_model on the toy task; keyword arguments replace `EvalSettings` fields."""
  options = dict(SETTINGS, ks=(1, 2, 4, 64), progress=False, save_text=True, keep_samples=KEEP)
  options.update(kwargs)
  decode = ("max_new_tokens", "temperature", "top_p", "kv_chunk", "compactions")
  options["decoding"] = Decoding(**{k: options.pop(k) for k in decode if k in options})
  task = TaskSpec("toy", "toy", examples, correct_fn=toy_correct, answer_fn=toy_answer)
  return evaluate.evaluate_model(
    model,
    None,
    tok,
    task,
    evaluate.EvalSettings(**options),
    key=jax.random.key(7),
    out_dir=out_dir,
    on_problem=on_problem,
  )


@pytest.fixture(scope="module")
def full_run(tiny, tmp_path_factory):
  out_dir = str(tmp_path_factory.mktemp("full"))
  return run_toy(*tiny, toy_examples(), out_dir), out_dir


@pytest.mark.slow
def test_writes_files_with_consistent_numbers(full_run):
  results, out_dir = full_run
  for name in ("toy.jsonl", "toy.meta.json", "table.md", "table.json", "pass_at_k.png"):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0, name
  records = eval_results.read_records(os.path.join(out_dir, "toy.jsonl"))
  assert [r["index"] for r in records] == list(range(10))
  assert records == results["records"]
  n = np.array([r["n"] for r in records])
  c = np.array([r["c"] for r in records])
  assert np.all(n == N) and 0 < c.sum() < N * len(records)  # a test that could fail
  assert all(sum(r["correct"]) == r["c"] and len(r["answers"]) == N for r in records)
  table = json.load(open(os.path.join(out_dir, "table.json")))
  row = table["tasks"]["toy"]
  assert {"greedy", "pass@1", "pass@2", "pass@4", "maj@4"} <= set(row) and "pass@64" not in row
  for k in (1, 2, 4):
    assert row[f"pass@{k}"] == pytest.approx(np.mean(pass_at_k(n, c, k)), abs=1e-12)
    votes = [maj_at_k(r["answers"], k=k, correct=r["correct"]) for r in records]
    assert row[f"maj@{k}"] == pytest.approx(np.mean(votes), abs=1e-12)
  assert row["pass@1"] == pytest.approx(c.sum() / n.sum())
  assert row["greedy"] == pytest.approx(np.mean([r["greedy_correct"] for r in records]))
  assert row["pass_at_k_curve"]["value"][-1] == row["pass@4"]
  assert table["macro"]["pass@1"] == row["pass@1"]
  lengths = [len(t) for r in records for t in r["texts"]]
  assert all(0 < r["mean_length"] <= NEW_TOKENS for r in records) and lengths
  assert 0 < row["mean_entropy"] <= np.log(256) + 1e-4  # nats, below ln(vocab)
  md = open(os.path.join(out_dir, "table.md")).read()
  assert "| toy |" in md and "| macro average |" in md and f"{row['pass@1']:.3f}" in md


SAMPLES = "toy.samples.jsonl"


def test_samples_file_holds_prompts_completions_answers_and_verdicts(tiny, full_run, tmp_path):
  results, out_dir = full_run
  lines = eval_results.read_records(os.path.join(out_dir, SAMPLES))
  assert [ln["index"] for ln in lines] == list(range(KEEP))  # the first KEEP problems only
  examples = toy_examples()
  for line, record in zip(lines, results["records"], strict=False):
    assert line["id"] == record["id"] and line["gold"] == "x"
    assert line["prompt"] == data.format_prompt(examples[line["index"]], tiny[1])
    texts = [s["completion"] for s in line["samples"]]
    assert texts == record["texts"] and len(texts) == N
    assert [s["answer"] for s in line["samples"]] == [toy_answer(t) for t in texts]
    assert [s["correct"] for s in line["samples"]] == record["correct"]
    assert line["greedy"]["completion"] == record["greedy_text"]
    assert line["greedy"]["correct"] == int(record["greedy_correct"])
  assert 0 < sum(s["correct"] for ln in lines for s in ln["samples"]) < KEEP * N
  # A crash after a samples line but before its record: the rerun redoes the problem, not the
  # line. Without save_text the records hold no texts, the samples file still does.
  for name in ("toy.jsonl", "toy.meta.json", SAMPLES):
    text = open(os.path.join(out_dir, name)).read()
    if name == "toy.jsonl":
      text = "".join(text.splitlines(keepends=True)[:2])
    (tmp_path / name).write_text(text)
  (tmp_path / SAMPLES).write_text((tmp_path / SAMPLES).read_text() + '{"index": 9, "torn')
  redone = run_toy(*tiny, examples, str(tmp_path), save_text=False)
  assert (tmp_path / SAMPLES).read_text() == open(os.path.join(out_dir, SAMPLES)).read()
  new = [r for r in redone["records"] if r["index"] >= 2]  # the first two: copied, with texts
  assert new and all("texts" not in r and "greedy_text" not in r for r in new)
  run_toy(*tiny, examples[:2], str(tmp_path / "fresh"), keep_samples=0)
  assert not (tmp_path / "fresh" / SAMPLES).exists()
  run_toy(*tiny, examples[:2], str(tmp_path), resume=False, keep_samples=1)  # starts over
  assert [ln["index"] for ln in eval_results.read_records(str(tmp_path / SAMPLES))] == [0]


def test_macro_average_covers_only_the_averaged_tasks(tmp_path):
  def summary(p1, problems):
    curve = {"k": [1, 2], "value": [p1, min(1.0, 2 * p1)]}
    return {"num_problems": problems, "num_samples": 2, "pass@1": p1, "pass_at_k_curve": curve}

  # The forgetting layout: four averaged held-out tasks, MBPP on its own.
  values = {"csqa": 0.8, "hotpotqa": 0.2, "gpqa": 0.3, "mbpp": 0.9, "countdown": 0.1}
  summaries = {name: summary(v, 10 + i) for i, (name, v) in enumerate(values.items())}
  four = ["csqa", "hotpotqa", "gpqa", "countdown"]
  eval_results.write_report(summaries, str(tmp_path), averaged=four)
  table = json.load(open(tmp_path / "table.json"))
  assert table["macro"]["pass@1"] == pytest.approx((0.8 + 0.2 + 0.3 + 0.1) / 4)  # not 0.46
  assert table["macro"]["num_problems"] == 10 + 11 + 12 + 14
  assert table["macro_tasks"] == four and table["tasks"]["mbpp"]["pass@1"] == 0.9
  lines = (tmp_path / "table.md").read_text().splitlines()
  names = [ln.split("|")[1].strip() for ln in lines[2:8]]
  assert names == [*four, "macro average (csqa, hotpotqa, gpqa, countdown)", "mbpp (not averaged)"]
  eval_results.write_report(summaries, str(tmp_path / "all"))  # default: every task averaged
  macro_all = json.load(open(tmp_path / "all" / "table.json"))["macro"]["pass@1"]
  assert macro_all == pytest.approx(np.mean(list(values.values())))
  assert "| macro average |" in (tmp_path / "all" / "table.md").read_text()


def test_samples_differ_across_problems_and_samples(full_run):
  texts = [t for r in full_run[0]["records"] for t in r["texts"]]
  assert len(set(texts)) > len(texts) // 2  # fresh keys per sample, not one stream reused


def test_greedy_sample_equals_direct_generate(tiny):
  model, tok = tiny
  examples = toy_examples(BATCH)  # one full block: the greedy batch is exactly these prompts
  results = run_toy(model, tok, examples, num_samples=1)
  ids, mask = encode_prompts(tok, [data.format_prompt(ex, tok) for ex in examples])
  out = generate(
    model,
    ids,
    mask,
    Decoding(NEW_TOKENS, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id),
    key=jax.random.key(123),
  )
  tokens, out_mask = np.asarray(out.tokens), np.asarray(out.mask)
  for i, record in enumerate(results["records"]):
    assert record["greedy_text"] == tok.decode(tokens[i][out_mask[i]], skip_special_tokens=True)
    assert record["greedy_length"] == int(out.lengths[i])


class Stop(Exception):
  pass


def crash_after(n):
  """An on_problem hook that raises Stop once n problems are done (a crash mid-evaluation)."""
  seen = []

  def hook(record):
    seen.append(record["index"])
    if len(seen) == n:
      raise Stop

  return hook


def test_interrupted_run_resumes_to_identical_results(tiny, full_run, tmp_path):
  model, tok = tiny
  with pytest.raises(Stop):
    run_toy(model, tok, toy_examples(), str(tmp_path), on_problem=crash_after(3))
  assert len(eval_results.read_records(str(tmp_path / "toy.jsonl"))) == 3
  assert [r["index"] for r in eval_results.read_records(str(tmp_path / SAMPLES))] == [0, 1, 2]
  resumed = []
  results = run_toy(model, tok, toy_examples(), str(tmp_path), on_problem=resumed.append)
  assert [r["index"] for r in resumed] == list(range(3, 10))  # finished problems are skipped
  assert results["records"] == full_run[0]["records"]
  assert eval_results.read_records(str(tmp_path / "toy.jsonl")) == full_run[0]["records"]
  # Each kept problem's samples line once, as an uninterrupted run writes them.
  assert (tmp_path / SAMPLES).read_text() == open(os.path.join(full_run[1], SAMPLES)).read()
  table = (tmp_path / "table.json").read_text()
  assert table == open(os.path.join(full_run[1], "table.json")).read()


def test_torn_last_line_is_ignored_and_redone(tiny, full_run, tmp_path):
  model, tok = tiny
  lines = open(os.path.join(full_run[1], "toy.jsonl")).read().splitlines(keepends=True)
  for name in ("toy.jsonl", "toy.meta.json"):
    data_ = open(os.path.join(full_run[1], name)).read()
    if name == "toy.jsonl":
      data_ = "".join(lines[:6]) + lines[6][: len(lines[6]) // 2]  # killed mid-write
    (tmp_path / name).write_text(data_)
  assert [r["index"] for r in eval_results.read_records(str(tmp_path / "toy.jsonl"))] == list(
    range(6)
  )
  redone = []
  results = run_toy(model, tok, toy_examples(), str(tmp_path), on_problem=redone.append)
  assert [r["index"] for r in redone] == list(range(6, 10))
  assert results["records"] == full_run[0]["records"]
  assert open(tmp_path / "toy.jsonl").read() == "".join(lines)
  # The resumed segment's time is appended (the copied files hold no timing of their own).
  timing = eval_results.read_records(str(tmp_path / eval_results.TIMING_JSONL))
  assert [(t["label"], t["problems"]) for t in timing] == [("toy", 4)]
  assert eval_results.read_timing(str(tmp_path)) == {"toy": timing[0]["seconds"]} and (
    timing[0]["seconds"] > 0
  )


def test_bad_middle_line_and_changed_settings_are_refused(tiny, full_run, tmp_path):
  model, tok = tiny
  path = tmp_path / "x.jsonl"
  path.write_text('{"index": 0}\nnot json\n{"index": 2}\n')
  with pytest.raises(ValueError, match=r"x.jsonl:2"):
    eval_results.read_records(str(path))
  with pytest.raises(ValueError, match="temperature"):
    run_toy(model, tok, toy_examples(), full_run[1], temperature=0.5)
  with pytest.raises(ValueError, match="num_samples"):
    run_toy(model, tok, toy_examples(), num_samples=0)


@pytest.mark.slow
def test_refill_evaluation_resumes_and_is_not_mixed_with_the_static_layout(
  tiny, full_run, tmp_path
):
  """`refill` (a block's samples as one queue) is a sampling setting: stored in the meta, a
  resume must match it, and an interrupted refill evaluation resumes to the uninterrupted one."""
  model, tok = tiny
  whole = run_toy(model, tok, toy_examples(), str(tmp_path / "whole"), refill=True)
  assert json.loads((tmp_path / "whole" / "toy.meta.json").read_text())["refill"] is True
  assert len(whole["records"]) == 10 and whole["records"] != full_run[0]["records"]
  correct = [c for r in whole["records"] for c in r["correct"]]
  assert 0 < sum(correct) < len(correct)  # the toy verdicts vary
  with pytest.raises(Stop):
    run_toy(
      model, tok, toy_examples(), str(tmp_path / "cut"), refill=True, on_problem=crash_after(4)
    )
  resumed = run_toy(model, tok, toy_examples(), str(tmp_path / "cut"), refill=True)
  assert resumed["records"] == whole["records"]
  with pytest.raises(ValueError, match="refill"):
    run_toy(model, tok, toy_examples(), full_run[1], refill=True)


@pytest.mark.slow
def test_decode_layout_changes_no_record_and_resumes_across_layouts(tiny, full_run, tmp_path):
  """config.decode (bucketed cache reads, batch compaction) is speed only: the same records as
  the dense layout, nothing of it in the meta, and the Evaluator passes it to every decode."""
  model, tok = tiny
  layout = dict(kv_chunk=4, compactions=2)
  laid_out = run_toy(model, tok, toy_examples(), str(tmp_path / "laid_out"), **layout)
  entropy = lambda records: [r.pop("mean_entropy") for r in records]  # noqa: E731
  dense = [dict(r) for r in full_run[0]["records"]]
  np.testing.assert_allclose(entropy(laid_out["records"]), entropy(dense), rtol=1e-6)
  assert laid_out["records"] == dense  # the same tokens, answers and verdicts
  meta = json.loads((tmp_path / "laid_out" / "toy.meta.json").read_text())
  assert not set(layout) & set(meta)
  resumed = run_toy(model, tok, toy_examples(), full_run[1], report=False, **layout)
  assert resumed["records"] == full_run[0]["records"]  # not refused, nothing redone
  fields = {f"decode__{k}": v for k, v in layout.items()}
  evaluator = evaluate.Evaluator(smoke_config(demo_config, **fields), tok, run_data.run_keys(0))
  settings = evaluator.settings(2)
  assert (settings.decoding.kv_chunk, settings.decoding.compactions) == (4, 2)


def test_lazy_loader_is_not_called_when_everything_is_done(full_run):
  def loader():
    raise AssertionError("the model should not be loaded")

  before = eval_results.read_timing(full_run[1])
  results = run_toy(loader, tiny_tokenizer(), toy_examples(), full_run[1], report=False)
  assert results["records"] == full_run[0]["records"]
  assert eval_results.read_timing(full_run[1]) == before  # nothing sampled: no timing line


@pytest.mark.slow
def test_run_from_config_on_reasoning_gym(tiny, tmp_path):
  # method="evaluate": config.model (an HF directory) on config.eval's task plus an extra task.
  model, tok = tiny
  models.save_hf(model, tok, tmp_path / "model")
  config = smoke_config(
    demo_config,
    "",
    method="evaluate",
    model__source="hf",
    model__path=str(tmp_path / "model"),
    eval__limit=3,
    eval__extra_tasks=({"task": "reasoning_gym/chain_sum", "split": "train", "label": "again"},),
    eval__num_samples=2,
    eval__max_new_tokens=NEW_TOKENS,
    eval__batch_size=BATCH,
    eval__ks=(1, 2),  # k <= num_samples (config_check refuses k = 32 here)
  )
  results = evaluate.run(config, str(tmp_path / "work"))
  assert results["stopped"] is False
  out = tmp_path / "work" / "eval"
  for name in ("reasoning_gym_chain_sum.jsonl", "again.jsonl", "table.md", "pass_at_k.png"):
    assert (out / name).stat().st_size > 0, name
  table = json.loads((out / "table.json").read_text())
  assert set(table["tasks"]) == {"reasoning_gym_chain_sum", "again"}
  for label, row in table["tasks"].items():
    records = eval_results.read_records(str(out / f"{label}.jsonl"))
    assert len(records) == 3 and all(len(r["answers"]) == 2 for r in records)
    n, c = [r["n"] for r in records], [r["c"] for r in records]
    assert row["pass@2"] == pytest.approx(np.mean(pass_at_k(np.array(n), np.array(c), 2)))
  assert table["macro"]["pass@1"] == pytest.approx(
    np.mean([row["pass@1"] for row in table["tasks"].values()])
  )
  assert results["eval"]["pass@1"] == pytest.approx(table["macro"]["pass@1"])
  # Resuming with eval.refill flipped: refused in one line naming the field and the CLI way to
  # start over, before any file is touched (config.json still describes eval/).
  work = tmp_path / "work"
  before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
  flipped = with_fields(config, eval__refill=True)
  with pytest.raises(
    ConfigError, match=r"eval\.refill \(None saved, True now\).*eval\.restart=True"
  ):
    evaluate.run(flipped, str(work))
  assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == before
  restarted = evaluate.run(with_fields(flipped, eval__restart=True), str(work))
  assert restarted["stopped"] is False and (tmp_path / "work" / "eval.stale-1").is_dir()
  assert json.loads((out / "reasoning_gym_chain_sum.meta.json").read_text())["refill"] is True
  assert json.loads((work / "config.json").read_text())["eval"]["refill"] is True
  bad = smoke_config(demo_config, "", method="evaluate", model__source="nope")
  with pytest.raises(ValueError, match="config.model.source"):
    evaluate.run(bad, str(tmp_path / "work2"))


def test_orbax_source_restores_the_saved_params(tiny, tmp_path):
  model, tok = tiny
  models.save_hf(model, tok, tmp_path / "base")
  params = jax.tree.map(lambda x: x * 1.5, models.params(model))
  saver = checkpoint.Checkpointer(tmp_path / "ckpt", async_save=False)
  saver.save(3, state={"params": params, "opt": {"count": np.int32(3)}}, force=True)
  saver.close()
  restored, _ = model_io.load_model(
    {
      "source": "orbax",
      "path": str(tmp_path / "ckpt"),
      "base_source": "hf",
      "base_path": str(tmp_path / "base"),
    }
  )
  for a, b in zip(jax.tree.leaves(models.params(restored)), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(FileNotFoundError, match="missing"):
    model_io.load_model({"source": "orbax", "path": str(tmp_path / "missing")})


@pytest.mark.slow  # a whole smoke run first
def test_training_run_with_other_eval_settings_is_refused_before_writing(tmp_path):
  """A finished run rerun with eval.refill flipped: refused at startup, config.json untouched."""
  from experiments.runners import es_runner

  config = smoke_config(demo_config, method="es", eval__every=0, export_hf=False)
  es_runner.run(config, str(tmp_path))
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  with pytest.raises(ConfigError, match=r"eval\.refill.*--config\.eval\.restart=True"):
    es_runner.run(with_fields(config, eval__refill=True), str(tmp_path))
  after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != "run.lock"}
  assert after == {p: b for p, b in before.items() if p.name != "run.lock"}
