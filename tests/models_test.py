"""Model and loader tests: logits against transformers' PyTorch models, GGUF, bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import padded_batch, tiny_tokenizer, torch_logits, torch_model

from es_jax.models import (
  ForwardMode,
  Transformer,
  cast_params,
  forward,
  get_config,
  init_cache,
  load_hf,
  params,
  positions_from_mask,
  save_hf,
)
from es_jax.models.gguf_loader import load_gguf, tokenizer_from_gguf

LLAMA3_ROPE = dict(
  rope_scaling=dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
  ),
  rope_theta=500_000.0,
)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def hf_checkpoint(request, tmp_path_factory):
  arch = request.param
  extra = LLAMA3_ROPE if arch == "llama" else dict(tie_word_embeddings=True, rope_theta=1e6)
  ref = torch_model(arch, **extra)
  path = tmp_path_factory.mktemp(f"hf_{arch}")
  ref.save_pretrained(path)
  tiny_tokenizer().save_pretrained(path)
  return arch, ref, path


def _max_diff_on_real_tokens(a, b, mask):
  return float(np.abs(np.asarray(a) - np.asarray(b))[mask].max())


def test_load_hf_logits_match_transformers(hf_checkpoint):
  arch, ref, path = hf_checkpoint
  model, tok = load_hf(path)
  assert model.config.architecture == arch
  assert model.config.qkv_bias == (arch == "qwen2")
  assert tok.encode("the", add_special_tokens=False)  # tokenizer files were read
  ids, mask = padded_batch()
  expected = torch_logits(ref, ids, mask)
  assert np.abs(expected).max() > 1.0  # logits are O(1): a layout bug could not hide
  got = model(jnp.asarray(ids), jnp.asarray(mask))
  assert _max_diff_on_real_tokens(got, expected, mask) <= 1e-4


def test_save_hf_round_trip_loads_in_transformers(hf_checkpoint, tmp_path):
  import torch
  from transformers import AutoModelForCausalLM

  _, ref, path = hf_checkpoint
  model, tok = load_hf(path)
  out = save_hf(model, tok, tmp_path / "export")
  reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  ids, mask = padded_batch(seed=1)
  diff = _max_diff_on_real_tokens(
    torch_logits(reloaded, ids, mask), torch_logits(ref, ids, mask), mask
  )
  assert diff <= 1e-5
  again, _ = load_hf(out)
  jax.tree.map(np.testing.assert_array_equal, params(again), params(model))


@pytest.mark.parametrize("kv_chunk", [None, 2, 5])
def test_kv_cache_decode_equals_full_forward(hf_checkpoint, kv_chunk):
  _, _, path = hf_checkpoint
  model, _ = load_hf(path, tokenizer=False)
  p, cfg = params(model), model.config
  ids, mask = padded_batch(seed=2, length=10)
  full, _ = forward(
    p, jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), config=cfg, mask=jnp.asarray(mask)
  )
  # Prefill the first 6 tokens, then decode the remaining 4 one at a time.
  cache = init_cache(cfg, ids.shape[0], ids.shape[1])
  pos = positions_from_mask(jnp.asarray(mask))
  logits, cache = forward(
    p,
    jnp.asarray(ids[:, :6]),
    pos[:, :6],
    config=cfg,
    mask=jnp.asarray(mask[:, :6]),
    mode=ForwardMode(cache, 0, kv_chunk),
  )
  steps = [logits]
  for t in range(6, 10):
    logits, cache = forward(
      p,
      jnp.asarray(ids[:, t : t + 1]),
      pos[:, t : t + 1],
      config=cfg,
      mask=jnp.asarray(mask[:, t : t + 1]),
      mode=ForwardMode(cache, t, kv_chunk),
    )
    steps.append(logits)
  decoded = jnp.concatenate(steps, axis=1)
  assert _max_diff_on_real_tokens(decoded, full, mask) <= 1e-4


def test_low_rank_hook_equals_materialised_perturbation(key):
  cfg = get_config("tiny-qwen2")  # tied embeddings: the head uses the embedding's delta too
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  p = params(model)
  r, scale = 3, 0.02  # perturbation comparable to the 0.02-scale init weights
  keys = iter(jax.random.split(key, 16))

  def factors(shape):
    m, n = shape[-2:]
    lead = shape[:-2]
    return (
      jax.random.normal(next(keys), (*lead, m, r)),
      jax.random.normal(next(keys), (*lead, n, r)),
    )

  deltas = {
    "embed": factors(p["embed"].shape),
    "layers": {k: factors(p["layers"][k].shape) for k in ("wq", "wv", "w_down")},
  }
  perturbed = jax.tree.map(lambda x: x, p)
  a, b = deltas["embed"]
  perturbed["embed"] = p["embed"] + scale * a @ b.T
  for name, (a, b) in deltas["layers"].items():
    perturbed["layers"][name] = p["layers"][name] + scale * jnp.einsum("lmr,lnr->lmn", a, b)
  ids, mask = padded_batch(seed=3)
  pos = positions_from_mask(jnp.asarray(mask))
  hooked, _ = forward(
    p, jnp.asarray(ids), pos, config=cfg, mask=jnp.asarray(mask), deltas=deltas, delta_scale=scale
  )
  dense, _ = forward(perturbed, jnp.asarray(ids), pos, config=cfg, mask=jnp.asarray(mask))
  base, _ = forward(p, jnp.asarray(ids), pos, config=cfg, mask=jnp.asarray(mask))
  assert _max_diff_on_real_tokens(hooked, base, mask) > 1e-2  # the hook did something
  assert _max_diff_on_real_tokens(hooked, dense, mask) <= 1e-5


# ----------------------------------------------------------------------------- GGUF


def _permute_like_llama_cpp(w, n_head):
  """The row regrouping llama.cpp's converter applies to Q/K ([out, in] layout)."""
  return (
    w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
  )


def write_tiny_gguf(path, ref, tokenizer, qtype_name="F32"):
  """Writes `ref` (a tiny HF Llama) as GGUF the way llama.cpp's converter lays it out."""
  import gguf
  from gguf.quants import quantize
  from tiny_models import byte_vocab

  cfg = ref.config
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  tokens, merges = byte_vocab()
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("smollm")
  w.add_token_list(tokens)
  w.add_token_merges([" ".join(m) for m in merges])
  w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
  w.add_bos_token_id(tokens.index("<|im_start|>"))
  w.add_eos_token_id(tokens.index("<|im_end|>"))
  w.add_pad_token_id(tokens.index("<|endoftext|>"))
  w.add_chat_template(tokenizer.chat_template)
  names = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
  }
  layer = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
  }
  qtype = gguf.GGMLQuantizationType[qtype_name]
  written = {}
  for name, t in ref.state_dict().items():
    t = t.float().numpy()
    if name in names:
      gname = names[name]
    else:
      _, _, i, rest = name.split(".", 3)
      gname = f"blk.{i}.{layer[rest.rsplit('.', 1)[0]]}.weight"
      if rest.startswith("self_attn.q_proj"):
        t = _permute_like_llama_cpp(t, cfg.num_attention_heads)
      elif rest.startswith("self_attn.k_proj"):
        t = _permute_like_llama_cpp(t, cfg.num_key_value_heads)
    if t.ndim == 2 and qtype_name != "F32":
      w.add_tensor(gname, quantize(t, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(gname, t)
    written[gname] = t
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return written


@pytest.fixture(scope="module")
def llama_ref():
  return torch_model("llama", rope_theta=10_000.0)


def test_gguf_f32_logits_match_transformers(llama_ref, tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, llama_ref, tiny_tokenizer())
  model, _ = load_gguf(path)
  ids, mask = padded_batch(seed=4)
  got = model(jnp.asarray(ids), jnp.asarray(mask))
  assert _max_diff_on_real_tokens(got, torch_logits(llama_ref, ids, mask), mask) <= 1e-4


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "F16"])
def test_gguf_quantised_weights_equal_reference_dequantisation(llama_ref, tmp_path, qtype):
  import gguf
  from gguf.quants import dequantize, quantize

  path = tmp_path / f"tiny_{qtype}.gguf"
  write_tiny_gguf(path, llama_ref, tiny_tokenizer(), qtype)
  model, _ = load_gguf(path)
  p = params(model)
  q = gguf.GGMLQuantizationType[qtype]
  # Reference: HF weight -> llama.cpp layout -> quantise -> dequantise -> HF layout, transposed.
  ref_q = llama_ref.model.layers[1].self_attn.q_proj.weight.detach().numpy()
  permuted = _permute_like_llama_cpp(ref_q, llama_ref.config.num_attention_heads)
  deq = dequantize(quantize(permuted, q), q).reshape(permuted.shape)
  h = llama_ref.config.num_attention_heads
  unpermuted = deq.reshape(h, -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
  np.testing.assert_array_equal(np.asarray(p["layers"]["wq"][1]), unpermuted.T)
  ref_down = llama_ref.model.layers[0].mlp.down_proj.weight.detach().numpy()
  deq_down = dequantize(quantize(ref_down, q), q).reshape(ref_down.shape)
  np.testing.assert_array_equal(np.asarray(p["layers"]["w_down"][0]), deq_down.T)
  err = np.abs(np.asarray(p["layers"]["w_down"][0]) - ref_down.T).max()
  assert 0 < err < 0.25 * np.abs(ref_down).max()  # really quantised, and close


def test_gguf_tokenizer_matches_transformers_gguf_reader(llama_ref, tmp_path):
  from gguf import GGUFReader
  from transformers import AutoTokenizer

  path = tmp_path / "tok.gguf"
  write_tiny_gguf(path, llama_ref, tiny_tokenizer())
  ours = tokenizer_from_gguf(GGUFReader(str(path)))
  theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tok.gguf")
  for text in ["the then", "<|im_start|>user\nthe + 5<|im_end|>", "Hello, world!"]:
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(
      text, add_special_tokens=False
    ), text
  # llama.cpp's "smollm" pre-tokenizer splits digits one by one before BPE, so the "12" merge
  # never applies (transformers' GGUF reader ignores the pre-tokenizer type; it would merge).
  twelve = ours.encode(" 12", add_special_tokens=False)
  assert ours.convert_ids_to_tokens(twelve) == ["Ġ", "1", "2"]
  ids = ours.encode("<|im_start|>x<|im_end|>", add_special_tokens=False)
  assert ids[0] == ours.convert_tokens_to_ids("<|im_start|>") and len(ids) == 3
  assert ours.eos_token == "<|im_end|>"
  msgs = [{"role": "user", "content": "hi"}]
  assert ours.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith(
    "<|im_start|>assistant\n"
  )


# ----------------------------------------------------------------------------- bad input


def test_load_hf_errors_name_the_problem(hf_checkpoint, tmp_path):
  _, _, path = hf_checkpoint
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_hf(tmp_path)
  bad = tmp_path / "bad"
  bad.mkdir()
  cfg = json.loads((path / "config.json").read_text())
  (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
  with pytest.raises(ValueError, match="model_type='gpt_neox'"):
    load_hf(bad)
  (bad / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
  for f in path.glob("*.safetensors"):
    (bad / f.name).write_bytes(f.read_bytes())
  with pytest.raises(
    ValueError,
    match=r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
    r"\(128, 64\), expected \(96, 64\)",
  ):
    load_hf(bad, tokenizer=False)
  (bad / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}))
  with pytest.raises(ValueError, match="'hidden_size' is missing"):
    load_hf(bad)


def _copy_checkpoint(src, dst, tensors=None):
  """src's config and weights in dst, with `tensors` (name -> array) replaced."""
  from safetensors.numpy import load_file, save_file

  dst.mkdir()
  (dst / "config.json").write_bytes((src / "config.json").read_bytes())
  (f,) = src.glob("*.safetensors")
  weights = load_file(str(f))
  for name, fix in (tensors or {}).items():
    weights[name] = fix(weights[name])
  save_file(weights, str(dst / f.name), metadata={"format": "pt"})
  return dst / f.name


def test_load_hf_refuses_nonfinite_bad_dtype_and_truncated_files(hf_checkpoint, tmp_path):
  _, _, path = hf_checkpoint
  name = "model.layers.1.self_attn.v_proj.weight"

  def with_nan(w):
    w = w.copy()
    w[3, 5] = np.nan
    w[4, 0] = np.inf
    return w

  f = _copy_checkpoint(path, tmp_path / "nan", {name: with_nan})
  with pytest.raises(ValueError, match=f"{f}: tensor '{name}' holds 2 NaN/inf .* index \\(3, 5\\)"):
    load_hf(tmp_path / "nan", tokenizer=False)
  f = _copy_checkpoint(path, tmp_path / "int", {name: lambda w: w.astype(np.int32)})
  with pytest.raises(ValueError, match=f"{f}: tensor '{name}' has dtype int32"):
    load_hf(tmp_path / "int", tokenizer=False)
  f = _copy_checkpoint(path, tmp_path / "cut")
  os.truncate(f, f.stat().st_size // 2)
  with pytest.raises(ValueError, match=f"{f}: not a readable safetensors file"):
    load_hf(tmp_path / "cut", tokenizer=False)


def test_load_hf_names_a_config_that_is_not_json(hf_checkpoint, tmp_path):
  _, _, path = hf_checkpoint
  _copy_checkpoint(path, tmp_path / "j")
  (tmp_path / "j" / "config.json").write_text('{"model_type": "llama",\n  oops}')
  with pytest.raises(ValueError) as e:
    load_hf(tmp_path / "j", tokenizer=False)
  message = str(e.value)
  assert message.startswith(f"{tmp_path / 'j' / 'config.json'}: not valid JSON (line 2")
  assert "\n" not in message


def test_load_hf_refuses_an_extra_tensor_but_accepts_a_tied_head_copy(hf_checkpoint, tmp_path):
  from safetensors.numpy import load_file, save_file

  arch, _, path = hf_checkpoint

  def with_tensors(dst, add):
    f = _copy_checkpoint(path, tmp_path / dst)
    weights = load_file(str(f))
    weights.update(add(weights))
    save_file(weights, str(f), metadata={"format": "pt"})
    return f

  extra = "model.layers.0.self_attn.extra_proj.weight"
  f = with_tensors("extra", lambda w: {extra: np.ones((4, 4), np.float32)})
  with pytest.raises(ValueError, match=f"{f}: tensor '{extra}' is not used by this {arch}"):
    load_hf(tmp_path / "extra", tokenizer=False)
  inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq"  # a derived buffer: ignored
  with_tensors("inv", lambda w: {inv_freq: np.ones((8,), np.float32)})
  load_hf(tmp_path / "inv", tokenizer=False)
  if arch == "qwen2":  # tied embeddings: a saved copy of the tie loads, a different head does not
    embed = "model.embed_tokens.weight"
    with_tensors("tied", lambda w: {"lm_head.weight": w[embed].copy()})
    reference, _ = load_hf(path, tokenizer=False)
    model, _ = load_hf(tmp_path / "tied", tokenizer=False)
    assert np.array_equal(params(model)["embed"], params(reference)["embed"])
    with_tensors("untied", lambda w: {"lm_head.weight": w[embed] + 1.0})
    with pytest.raises(ValueError, match="'lm_head.weight' differs from model.embed_tokens"):
      load_hf(tmp_path / "untied", tokenizer=False)


def test_load_gguf_refuses_truncated_files_and_nonfinite_weights(llama_ref, tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, llama_ref, tiny_tokenizer())
  data = path.read_bytes()
  for keep in (len(data) - 100, len(data) // 2, 200, 20):
    cut = tmp_path / f"cut_{keep}.gguf"
    cut.write_bytes(data[:keep])
    with pytest.raises(ValueError, match=f"{cut}: .*(truncated|not a readable GGUF)"):
      load_gguf(cut)
  # A NaN in a weight names the GGUF tensor it came from.
  from gguf import GGUFReader

  reader = GGUFReader(str(path))
  (t,) = [t for t in reader.tensors if t.name == "blk.1.ffn_up.weight"]
  nan = bytearray(data)
  nan[t.data_offset + 8 : t.data_offset + 12] = np.float32(np.nan).tobytes()
  bad = tmp_path / "nan.gguf"
  bad.write_bytes(bytes(nan))
  with pytest.raises(ValueError, match=r"GGUF tensor blk.1.ffn_up.weight\): tensor .* NaN/inf"):
    load_gguf(bad)


def test_load_gguf_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    load_gguf(tmp_path / "nope.gguf")


@pytest.mark.slow  # a dtype invariant, no reference
def test_float32_masters_compute_in_the_config_dtype(key):
  # Master weights in float32 under a bf16 config: forward casts them, so the logits equal those
  # of the bf16 weights exactly, and differ from a float32 forward.
  cfg16 = get_config("tiny-qwen2", dtype="bfloat16")
  p32 = params(Transformer(cfg16.replace(dtype="float32"), rngs=nnx.Rngs(0)))
  p16 = cast_params(p32, jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  assert cast_params(p16, jnp.bfloat16)["embed"] is p16["embed"]  # no copy when already cast
  tokens = jax.random.randint(key, (2, 6), 0, cfg16.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
  out32_as16 = forward(p32, tokens, pos, config=cfg16)[0]
  out16 = forward(p16, tokens, pos, config=cfg16)[0]
  out32 = forward(p32, tokens, pos, config=cfg16.replace(dtype="float32"))[0]
  np.testing.assert_array_equal(np.asarray(out32_as16), np.asarray(out16))
  assert float(jnp.max(jnp.abs(out16 - out32))) > 1e-4
