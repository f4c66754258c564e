"""Every field an experiment reads, with defaults; the config files start from `base_config()`.

Field groups (each runner reads only its own groups plus `model`, `data`, `eval`, `checkpoint`):

  method       es | grpo | sequential | evaluate | demo | sparsity | population_sweep |
               diversity | calibrate | fair_study | report.
  seed         the run key is jax.random.key(seed); every random choice derives from it.
  model        where the weights come from (see `experiments.model_io.load_model`).
  data         the training task: prompts per step, shuffling, reward.
  eval         held-out evaluation: periodic (every `every` steps, a small slice) and final.
  es           ES hyperparameters (docs/method.md §1-2).
  grpo         GRPO hyperparameters (docs/method.md §3).
  sequential   the two-stage schedule (docs/method.md §4).
  checkpoint   Orbax checkpoints: interval, how many to keep, async writes.
  mesh         device mesh: `pop` devices for the population / GRPO batch (0 = all), `model`;
               `check_memory`: refuse on TPU a config predicted not to fit HBM.
  decode       decode layout (bucketed KV reads, batch compaction): speed, not results.
  diversity    the population diversity study (experiments/diversity.py, docs/method.md §6).
  report       a report across finished runs (experiments/report.py).

Sample files for offline smoke runs live in experiments/configs/sample_data/.
"""

from __future__ import annotations

import os

import ml_collections

SAMPLE_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample_data")
# The one method table: config.method -> the runner "module:function(config, workdir)" that
# experiments.main calls.
METHODS = {
  "es": "experiments.es_runner:run",
  "grpo": "experiments.grpo_runner:run",
  "sequential": "experiments.sequential:run",
  "evaluate": "experiments.evaluate:run",
  "demo": "experiments.demo:run",
  "sparsity": "experiments.sparsity:run",
  "population_sweep": "experiments.population_sweep:run",
  "diversity": "experiments.diversity:run",
  "report": "experiments.report:run",
  "calibrate": "experiments.calibration:run",
  "fair_study": "experiments.fair_study:run",
}

_TRAINING_GROUPS = ("model", "data", "eval", "checkpoint", "mesh", "decode")
# The config groups each method reads (the printed config shows these, plus the top-level
# fields); method="evaluate" reads `data` too when eval.task is "file" (its fields and reward).
METHOD_GROUPS = {
  "es": (*_TRAINING_GROUPS, "es"),
  "grpo": (*_TRAINING_GROUPS, "grpo"),
  "sequential": (*_TRAINING_GROUPS, "es", "grpo", "sequential"),
  "evaluate": ("model", "eval", "decode"),
  "demo": (*_TRAINING_GROUPS, "es", "grpo", "sequential", "demo"),
  "sparsity": ("model", "eval", "decode", "sparsity"),
  "population_sweep": (*_TRAINING_GROUPS, "es", "population_sweep"),
  "diversity": ("model", "eval", "es", "mesh", "decode", "diversity"),
  "report": ("report",),
  "calibrate": ("model", "data", "es", "mesh", "decode", "diversity"),
  "fair_study": (
    *_TRAINING_GROUPS,
    *("es", "grpo", "sequential", "demo", "diversity", "sparsity", "fair"),
  ),
}


def base_config() -> ml_collections.ConfigDict:
  """All fields with defaults (the paper's where it gives one); unlocked, callers lock."""
  c = ml_collections.ConfigDict()
  c.method = "es"
  c.seed = 0
  # source: default (bundled SmolLM2 GGUF) | hf | gguf | orbax | random. "random" builds
  # `preset` with random weights and the bundled SmolLM2 tokenizer (for smoke runs and tests).
  # dtype: the compute dtype; "" keeps the checkpoint's (bf16 for the paper's HF checkpoints),
  # or "bfloat16" / "float32" / "float16". Master weights: see es.master_dtype, grpo.master_dtype.
  c.model = dict(
    source="default", path="", base_source="default", base_path="", preset="", dtype=""
  )
  c.data = _data()
  c.eval = _eval()
  c.es = _es()
  c.grpo = _grpo()
  c.sequential = _sequential()
  c.checkpoint = dict(every=5, keep=3, async_save=True)
  c.export_hf = True  # write the final params as an HF directory (workdir/hf)
  # Stop a run (one `error:` line, exit status 2) when one update changes the weights by more
  # than this fraction of their norm, ‖Δθ‖₂/‖θ‖₂ (ES: a step; GRPO: an optimizer step); 0 = no
  # check. The shipped configs' smoke runs reach at most 0.012 (docs/usage.md); run_guard.py.
  c.max_update_ratio = 0.1
  # check_memory: on TPU devices, refuse a config whose programs es_jax.memory_plan predicts not
  # to fit the chip's HBM (before the first step); False skips the check.
  c.mesh = dict(pop=0, model=1, check_memory=True)
  # How every decode is laid out (ES members, GRPO rollouts, evaluations, diversity): kv_chunk:
  # while the generated tokens fit in this many KV cache slots after the prompt's, a step reads
  # only those and the prompt's (0 = the whole cache each step; past them the read is the same);
  # compactions: halvings of the batch as rows end, so finished rows stop costing (each compiles
  # another copy of the step). Speed only, like the mesh (a resume may change them): tokens are
  # key-determined whatever the layout, but a sample within float rounding of a token boundary
  # can differ (docs/benchmarks.md).
  c.decode = dict(kv_chunk=128, compactions=0)
  c.progress = True
  # Training completions for reading what the model wrote (experiments/samples_log.py): every
  # `log_samples_every` steps and at each stage's first and last step (0 = never), `log_samples`
  # of them with their rewards (ES: members from the best and worst fitness in, GRPO: rows with
  # advantages) into WORKDIR/samples.jsonl and TensorBoard text.
  c.log_samples_every = 10
  c.log_samples = 4
  # method="demo": the runs to compare after the base model ("es", "es_coverage", "grpo",
  # "grpo_es", "es_grpo"; es_coverage is ES with es.shaping="coverage").
  c.demo = dict(runs="es,grpo,grpo_es,es_grpo")
  # method="sparsity" (docs/method.md §7): a tuned run / checkpoint / HF dir against config.model.
  # method="population_sweep" (docs/method.md §8): ES once per N; smoothed training reward per N.
  # ema_decay: the smoothing, a debiased EMA s_t = d·s_{t-1} + (1-d)·r_t, ŝ_t = s_t / (1 - d^t)
  # (0 = none); tolerance: the smallest N within this of the largest N's smoothed reward.
  c.population_sweep = dict(sizes="8,16,32,64", ema_decay=0.99, tolerance=0.01, evaluate=False)
  c.sparsity = dict(
    tuned="", taus=(2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3), top_fraction=1e-3
  )
  c.diversity = _diversity()
  c.fair = _fair()
  # method="report": a report across runs, read from their files (experiments/report.py).
  # workdirs: run directories, comma-separated (a demo's workdir stands for its runs; a
  # method=diversity workdir adds JS_succ to the run it measured); names: one label per run in
  # the order they are found, or dir=label pairs ("" = from each run's config); out: "" =
  # WORKDIR/report; pairs: "name:other" pairs, comma-separated, whose paired differences
  # (name − other on the same problems) are tabulated, e.g. "ES:GRPO".
  c.report = dict(workdirs="", names="", out="", pairs="")
  return c


def _data() -> dict:
  """The training task: what a step's prompts are and how completions are scored."""
  # task: a dataset of es_jax.data.TASKS, "reasoning_gym/<task>", or "file": your own
  # question/answer file `path` (.jsonl, .json, .csv, .parquet, or a `datasets` save_to_disk
  # split directory; es_jax.data.files) whose fields
  # `question_field` / `answer_field` hold question and gold answer, with `reward` a reward name
  # or "module:function" / "file.py:function" (completion: str, example: dict) -> float.
  return dict(
    task="reasoning_gym/chain_sum",
    path="",  # task "file": the question/answer file
    question_field="question",  # task "file": the field shown to the model
    answer_field="answer",  # task "file": the gold answer's field
    # task "file": "" = the model's chat template (system prompt and answer-format instruction of
    # the reward); else a format string over the row's fields fed as is, e.g. "Q: {question}\nA:"
    prompt_template="",
    split="train",
    limit=256,  # examples in the training pool (reasoning-gym: problems generated)
    task_config={},  # reasoning-gym generator options ({} = the task's defaults)
    data_dir="",  # prepared TFDS data ("" = TFDS's default directory)
    source_dir="",  # downloaded original files ("" = use what data_dir holds)
    on_bad_row="raise",  # a bad row of the source files: "raise" (naming file and line) or "skip"
    # reward name ("" = the task's own, es_jax.rewards.TASK_REWARDS), or module:function. Math
    # tasks' own rewards read \boxed{} answers only (the paper's); "gsm8k_hash" / "math_hash"
    # also take "#### n".
    reward="",
    # seconds a user's reward (module:function) may take to import and per call (docs/usage.md)
    reward_timeout=60.0,
    prompts_per_step=8,  # P: the paper uses 64
    shuffle=True,  # a new permutation per epoch (a fixed function of seed and epoch)
  )


def _eval() -> dict:
  """Held-out evaluation: periodic (a small slice every `every` steps) and final."""
  return dict(
    task="reasoning_gym/chain_sum",
    # task "file": the held-out file ("" = data.path, the training file); fields, template and
    # reward are data's
    path="",
    split="test",
    limit=64,  # problems in the final evaluation
    task_config={},  # reasoning-gym generator options ({} = the task's defaults)
    data_dir="",
    source_dir="",
    on_bad_row="raise",
    # Every evaluation is disjoint from the training pool (config.data): reasoning-gym tasks draw
    # problems outside it; a file or TFDS task's rows that are training prompts are counted and
    # warned about, and with drop_seen=True dropped, repeated rows too (experiments.eval_data)
    drop_seen=False,
    num_samples=8,  # n per problem at `temperature` (paper: 32)
    temperature=0.6,
    top_p=1.0,
    max_new_tokens=64,
    batch_size=64,
    # Continuous batching (es_jax.decode_queue): a block's samples go through batch_size rows,
    # a row refilled as its sample ends, so decode steps follow the tokens generated rather than
    # each batch's longest completion. Draws per sample differ from refill=False's (own keys).
    refill=False,
    ks=(1, 2, 4, 8),  # k of Pass@k and Maj@k, each <= num_samples (periodic: k <= its n only)
    every=0,  # periodic eval every this many steps (0 = only before and after training)
    periodic_limit=16,  # problems in a periodic eval (the first `periodic_limit` of the slice)
    periodic_num_samples=4,
    final=True,  # evaluate the final params on `limit` problems and write workdir/eval
    # True: start the final evaluation over, moving a saved WORKDIR/eval to eval.stale-<n> (a
    # resume with other eval settings is refused otherwise); every run with it set starts over
    restart=False,
    # The final evaluation's prompt, completions, extracted answers and verdicts of the first
    # `keep_samples` problems of each task, in eval/<label>.samples.jsonl (0 = none)
    keep_samples=16,
    # More tasks for the final evaluation (macro-averaged with `task`): task names, or dicts
    # {task, split, limit, task_config, data_dir, source_dir, on_bad_row, label, average}; split,
    # limit, data_dir and on_bad_row default to this section's; average=False: a row of its own,
    # not in the macro average. E.g. held-out tasks to check for forgetting (docs/method.md §7).
    extra_tasks=(),
  )


def _es() -> dict:
  """ES hyperparameters (docs/method.md §1-2)."""
  return dict(
    num_steps=10,
    population_size=32,  # N
    sigma=1.5e-3,
    learning_rate=2.5e-4,  # α; θ ← θ + (α/N) Σ z_i ε_i with optimizer "sgd"
    optimizer="sgd",  # "sgd" (the paper) | "adam"
    # "zscore" | "centered_rank" | "per_prompt_zscore" | "coverage" | "shuffled" (the null
    # control: z-scores permuted across members each step, same drift, no signal)
    shaping="zscore",
    antithetic=False,
    rank=0,  # 0 = full rank; r > 0 = EGGROLL low rank r
    low_rank_vectors="full",  # "full" | "frozen": non-matrix leaves in low rank
    # Weights and arithmetic for a bf16 (or fp16) model (docs/method.md §1, "Arithmetic modes");
    # round = rounding to the model's dtype. For a float32 model all choices compute the same.
    # master_dtype: the dtype ES keeps and updates the weights in. "float32" (default): float32
    #   masters; members θ + σε and the update are computed in float32, members run in the
    #   model's dtype. "": the model's dtype; θ + Δ is rounded once to it (updates below its
    #   resolution are lost).
    master_dtype="float32",
    # arithmetic: how a member θ + σε is formed (es_jax.noise.NoiseSpec's precision).
    #   "fp32": float32(w) + σε, rounded once to the weights' dtype.
    #   "bf16_faithful": round(w + round(σε)) (es_jax.noise.apply_noise).
    #   "bf16_shared_noise": Qiu et al.'s code (es_jax.reference_arithmetic): one noise per
    #     tensor shape drawn in bf16, in-place perturb/restore residues, the update summed in bf16.
    #   "bf16_tensor_noise": the understanding-es reproduction's code: per-tensor fp32 noise,
    #     σε rounded once, residues kept, the update summed in fp32 and rounded once.
    #   All but "fp32" need master_dtype ""; the last two also optimizer "sgd", rank 0,
    #   antithetic False and shaping zscore, centered_rank or shuffled.
    arithmetic="fp32",
    members_per_chunk=1,  # members vmapped together on a device
    max_new_tokens=64,
    temperature=0.0,  # 0 = greedy fitness (the paper's Easy setting)
    top_p=1.0,
    # Sampled fitness (temperature > 0): every member draws its completions with the step's one
    # sampling key, as the reference code seeds each iteration once (common random numbers:
    # members then differ by their perturbation, not by sampling luck, which lowers the variance
    # of fitness differences). False gives each member its own key fold_in(key, i).
    share_sample_key=True,
  )


def _grpo() -> dict:
  """GRPO hyperparameters (docs/method.md §3)."""
  return dict(
    num_steps=10,
    num_generations=8,  # G
    learning_rate=1e-6,
    weight_decay=0.0,
    max_grad_norm=1.0,
    # AdamW master weights and moments: "float32" (default; forward/backward run in the model's
    # dtype, as verl and TRL train bf16 models), or "" to keep the model's dtype (pure bf16
    # AdamW: at lr 1e-6 most updates are below bf16's resolution).
    master_dtype="float32",
    beta=0.001,  # k3 KL weight against the base model (0 skips the reference)
    eps_low=0.2,
    eps_high=0.2,
    aggregation="seq_mean_token_mean",
    advantage_std="population",  # "population" | "unbiased" | "none" (Dr.GRPO)
    mini_batch_size=0,  # rows per optimizer step (0 = the whole rollout, one step)
    micro_batch_size=8,  # rows per device per accumulation step
    # Recompute each layer in the backward pass (gradient checkpointing): same gradients, about
    # one more forward pass; needed for long completions (the paper configs set it).
    remat=False,
    max_new_tokens=64,
    temperature=1.0,
    top_p=1.0,
  )


def _sequential() -> dict:
  """The two-stage schedule (docs/method.md §4)."""
  return dict(
    order="grpo_es",  # "grpo_es" | "es_grpo"
    total_steps=20,  # one budget of update steps shared by the two stages
    first_fraction=0.5,  # share of total_steps given to the first stage
    # GRPO's KL reference in ES→GRPO: "base" (the original model, as in a GRPO-only run) or
    # "stage1" (the ES stage's output). GRPO→ES has no KL in its second stage.
    kl_reference="base",
  )


def _diversity() -> dict:
  """The population diversity study and σ calibration (docs/method.md §6, §6.1)."""
  # method="diversity" (docs/method.md §6): n samples per member per eval problem; JS_succ, unions,
  # JS_pol. run: an ES run dir ("" = config.model with config.es); step: its checkpoint (-1 the
  # newest); key_step: the step key's global step (-1: the params' step, the run's own key);
  # population_size / sigma: 0 = config.es's (the run's). kinds: es, group (one policy: GRPO's
  # G samples), control (σ = 0). correction: null | miller_madow | none (metrics module).
  # checkpoints: the study at every checkpoint of `run` (JS_succ beside the Pass@n gain).
  # method="calibrate" (docs/method.md §6.1): the population around the base model for each of
  # `sigmas` on the first `limit` training problems; recommends the smallest σ with at least
  # `min_changed` of greedy completions changed and mean fitness >= base - `fitness_tolerance`,
  # extending the grid (x3 beyond an edge, at most `extensions` times) until that σ is interior
  # and a larger σ has JS_succ above zero; restart: measure every σ again (rows of a stopped
  # calibration under another config are refused, never reused).
  return dict(
    run="",
    step=-1,
    key_step=-1,
    population_size=0,
    sigma=0.0,
    num_samples=8,
    temperature=0.6,
    limit=16,
    prompts_per_call=4,
    pol_prompts=2,
    pol_samples=2,
    bootstrap=1000,
    correction="null",
    kinds="es,group,control",
    checkpoints=False,
    sigmas=(1e-3, 3e-3, 1e-2, 3e-2),
    min_changed=0.1,
    fitness_tolerance=0.05,
    extensions=3,
    restart=False,
  )


def _fair() -> dict:
  # method="fair_study" (experiments/fair_study.py): σ from method=calibrate (calibrate=False:
  # es.sigma); pilots of pilot_steps steps, scored by training reward: ES α = ratio·σ for each
  # of alpha_ratios, GRPO lr for each of grpo_lrs (the first listed wins ties); then demo.runs
  # at the chosen values, the diversity study of the final ES model (diversity) and the drift
  # and sparsity of the ES-type runs against the null-walk prediction. redo: stages to start
  # over, comma-separated (calibration, pilots, runs, diversity; each later stage is redone too);
  # a stage measured under another config is refused, naming the fields. design=2 (study v2,
  # experiments/study_v2.py): pilot grids extended (extensions times, x3 beyond the edge) until
  # each winner is interior; ES arms at the calibrated σ, at a wider σ with measurable JS_succ
  # and with sampled fitness (sampled_temperature); a second seed (second_seed) for the best ES
  # arm and GRPO; arms that move sampled Pass@1 rerun with their null for extend_steps steps;
  # preregistration: the commit of the pre-registration the report names.
  return dict(
    calibrate=True,
    alpha_ratios=(0.5, 0.25, 1.0),
    grpo_lrs=(1e-5, 3e-6, 3e-5),
    pilot_steps=6,
    diversity=True,
    redo="",
    design=1,
    extensions=2,
    sampled_temperature=0.6,
    second_seed=1,
    extend_steps=100,
    preregistration="",
  )


def smoke(c: ml_collections.ConfigDict, *, preset: str, data: str | None, eval_data: str | None):
  """Turns `c` into its `:smoke` variant in place: a random `preset` model with the bundled
  tokenizer, the shipped sample files of datasets `data` / `eval_data` (None: keep the task, e.g.
  reasoning-gym), tiny sizes and one device; end to end in well under a minute on a CPU."""
  c.model.update(source="random", preset=preset, path="")
  c.data.reward = "char_parity"  # a random model scores 0 on any task: see es_jax.rewards.synthetic
  c.data.update(limit=min(c.data.limit, 24), prompts_per_step=2)
  if data:
    c.data.source_dir = sample_dir(data)
  if eval_data:
    c.eval.source_dir = sample_dir(eval_data)
  c.eval.update(
    limit=4,
    num_samples=2,
    ks=(1, 2),
    max_new_tokens=8,
    batch_size=6,
    every=2,
    periodic_limit=2,
    periodic_num_samples=2,
  )
  c.es.update(num_steps=3, population_size=4, members_per_chunk=2, max_new_tokens=8)
  c.grpo.update(
    num_steps=3, num_generations=2, max_new_tokens=8, mini_batch_size=0, micro_batch_size=2
  )
  c.sequential.update(total_steps=4)
  c.checkpoint.update(every=1, keep=2)
  c.log_samples_every = 1
  c.diversity.update(
    limit=2, num_samples=2, prompts_per_call=2, pol_prompts=1, pol_samples=2, bootstrap=200
  )
  c.population_sweep.sizes = "2,4"  # the smoke ES population is 4; N = 8..64 is not small
  c.mesh.pop = 1  # tiny batches: one device (the tests run with 8 fake CPU devices)
  return c


# The paper's held-out tasks for forgetting (docs/method.md §5, §10.2), each with the split the
# builders read (es_jax.data.builders) and that split's size in the files named there: CSQA's
# dev_rand_split.jsonl, HotpotQA's distractor dev set, GPQA-Diamond, MBPP's test task ids 11-510
# (scored by running the code in a sandboxed process, es_jax.rewards.code); Countdown's
# test.jsonl has no standard size (None: all of it). The held-out sets differ by setting
# (paper): Easy holds out all five and its average (Table 10) covers all five, MBPP included;
# Hard holds out GPQA-Diamond, MBPP, CSQA and Countdown (no HotpotQA), averaged (Table 5).
_CSQA = {"task": "csqa", "split": "validation", "limit": 1221}
_GPQA = {"task": "gpqa", "split": "diamond", "limit": 198}
_MBPP = {"task": "mbpp", "split": "test", "limit": 500}
_COUNTDOWN = {"task": "countdown", "split": "test", "limit": None}
_HOTPOTQA = {"task": "hotpotqa", "split": "validation", "limit": 7405}
HELD_OUT_TASKS = {
  "easy": (_CSQA, _HOTPOTQA, _GPQA, _MBPP, _COUNTDOWN),
  "hard": (_CSQA, _GPQA, _MBPP, _COUNTDOWN),
}


def forgetting(c: ml_collections.ConfigDict, setting: str) -> ml_collections.ConfigDict:
  """Turns `c` into its `:forgetting` variant in place: method="evaluate" of config.model on the
  held-out tasks of `setting` ("easy" or "hard", HELD_OUT_TASKS) only (no math task, so the math
  score is never mixed in), with the config's sampling settings. eval/table.md has one row per
  task; its macro row is the paper's forgetting average: all of the setting's held-out tasks."""
  first, *rest = HELD_OUT_TASKS[setting]
  c.method = "evaluate"
  c.eval.update(
    task=first["task"],
    split=first["split"],
    limit=first["limit"],
    source_dir="",
    every=0,
    extra_tasks=tuple(dict(t) for t in rest),
  )
  return c


def parse_variant(variant: str | None, *, file: str, models, modes) -> tuple[str | None, str, bool]:
  """(model, mode, smoke) of a variant "[MODEL_][MODE_][smoke]", e.g. "qwen2.5-3b_sweep",
  "forgetting", "sweep_smoke"; model None when not named. Unknown parts raise ValueError."""
  parts = variant.split("_") if variant else []
  model = parts.pop(0) if parts and parts[0] in models else None
  mode = parts.pop(0) if parts and parts[0] in modes else ""
  smoke_run = parts == ["smoke"]
  if parts and not smoke_run:
    model_part = f"MODEL one of {sorted(models)}, " if models else ""
    raise ValueError(
      f"{file}: unknown variant {variant!r}; use {'[MODEL_]' if models else ''}[MODE_][smoke] "
      f"with {model_part}MODE one of {sorted(modes)}, e.g. '{sorted(modes)[0]}'."
    )
  return model, mode, smoke_run


def sample_dir(name: str) -> str:
  """The shipped sample files of dataset `name` (experiments/configs/sample_data/<name>)."""
  return os.path.join(SAMPLE_DATA, name)
