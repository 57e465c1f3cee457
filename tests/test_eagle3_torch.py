"""Interop: an EAGLE-3 head saved by specjax, read by an independent PyTorch implementation
of the EAGLE-3 head as vLLM runs it (vllm/model_executor/models/llama_eagle3.py), computes
the states and draft logits of specjax's own head (specjax/models/eagle.py). The torch side
reads only config.json and model.safetensors."""

import json

import pytest

torch = pytest.importorskip('torch')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from specjax import testing  # noqa: E402
from specjax.checkpoints import eagle3  # noqa: E402
from specjax.models import eagle as eagle_model  # noqa: E402
from specjax.models import llama  # noqa: E402
from specjax.models.kv_cache import KVCache  # noqa: E402

TOKENS = [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]


def rms(x, w, eps):
  x = x.float()
  return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):  # x [B, heads, T, H]; HF rotate_half
  h = x.shape[-1]
  inv = 1.0 / theta ** (torch.arange(0, h, 2, dtype=torch.float32) / h)
  ang = pos.float()[:, None] * inv[None]
  cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
  rot = torch.cat([-x[..., h // 2 :], x[..., : h // 2]], -1)
  return x * cos + rot * sin


def midlayer(w, c, x, embeds, start, past=None):
  """vLLM's Eagle-3 decoder layer on state x [B, T, D] and embeddings [B, T, D] at
  positions start..; past: cached (k, v) [B, G, S, H]. Returns (out, (k, v))."""
  lin = lambda y, name: y @ w[f'midlayer.{name}.weight'].T
  eps, n, g = c['rms_norm_eps'], c['num_attention_heads'], c['num_key_value_heads']
  hd = c.get('head_dim') or c['hidden_size'] // n
  b, t, _ = x.shape
  residual = x
  h = torch.cat(
    [
      rms(embeds, w['midlayer.input_layernorm.weight'], eps),
      rms(x, w['midlayer.hidden_norm.weight'], eps),
    ],
    -1,
  )
  pos = torch.arange(start, start + t)
  split = lambda y, heads: y.view(b, t, heads, hd).transpose(1, 2)
  q = rope(split(lin(h, 'self_attn.q_proj'), n), pos, c['rope_theta'])
  k = rope(split(lin(h, 'self_attn.k_proj'), g), pos, c['rope_theta'])
  v = split(lin(h, 'self_attn.v_proj'), g)
  if past is not None:
    k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
  s = k.shape[2]
  kk, vv = k.repeat_interleave(n // g, 1), v.repeat_interleave(n // g, 1)
  scores = q @ kk.transpose(-1, -2) * hd**-0.5
  causal = torch.arange(s)[None, :] <= (s - t + torch.arange(t))[:, None]
  probs = scores.masked_fill(~causal, float('-inf')).softmax(-1)
  attn = (probs @ vv).transpose(1, 2).reshape(b, t, n * hd)
  h = residual + lin(attn, 'self_attn.o_proj')
  y = rms(h, w['midlayer.post_attention_layernorm.weight'], eps)
  mlp = lin(
    torch.nn.functional.silu(lin(y, 'mlp.gate_proj')) * lin(y, 'mlp.up_proj'), 'mlp.down_proj'
  )
  return h + mlp, (k, v)


def draft_logits(w, c, out):
  return rms(out, w['norm.weight'], c['rms_norm_eps']) @ w['lm_head.weight'].T


def test_saved_head_matches_an_independent_torch_eagle3(tmp_path):
  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  ids = np.arange(0, cfg.vocab_size, 3)
  hc = eagle_model.EagleConfig.for_target(cfg, len(ids))
  hp = eagle_model.init_params(hc, jax.random.key(0), ids, params)
  hp['fc'] = hp['fc'] * 10  # larger states: distinct argmaxes
  for name in ('wq', 'wk'):  # peaked attention: RoPE and the positions matter
    hp['layer'][name] = hp['layer'][name] * 8
  rng = np.random.default_rng(0)  # distinct norm weights: a swapped norm name would show
  for name in ('embed_norm', 'hidden_norm', 'mlp_norm'):
    hp['layer'][name] = 1 + 0.3 * rng.standard_normal(hc.d_model).astype(np.float32)
  hp['norm'] = 1 + 0.3 * rng.standard_normal(hc.d_model).astype(np.float32)
  tokens = jnp.asarray([TOKENS])
  t = tokens.shape[1]
  feats = llama.forward(params, tokens, KVCache.init(cfg, 1, t), cfg, capture=hc.capture).features
  eagle3.save(tmp_path / 'head', hc, hp)

  # specjax, on the saved (bfloat16-rounded) weights
  hc2, hp2, _ = eagle3.load(tmp_path / 'head')
  assert hc2 == hc
  positions = jnp.arange(t - 1)[None]
  cache = KVCache.init(hc2, 1, 32)
  x = eagle_model.fuse(hp2, feats[:, :-1])
  valid = jnp.ones_like(positions, bool)
  out, cache = eagle_model.cached_step(
    hp2, params['embed'], x, tokens[:, 1:], positions, valid, cache, hc2
  )
  logits = eagle_model.head_logits(hp2, out, hc2)
  extra = jnp.asarray([[4]])  # the token after the sequence, for the fed-back step
  pos2 = jnp.asarray([[t - 1]])
  out2, _ = eagle_model.cached_step(
    hp2, params['embed'], out[:, -1:], extra, pos2, pos2 >= 0, cache, hc2
  )
  logits2 = eagle_model.head_logits(hp2, out2, hc2)

  # torch, from the files alone
  c = json.loads((tmp_path / 'head' / 'config.json').read_text())
  w = {k: v.float() for k, v in load_file(str(tmp_path / 'head' / 'model.safetensors')).items()}
  n_aux = len(c['eagle_config']['eagle_aux_hidden_state_layer_ids'])
  assert w['fc.weight'].shape == (c['hidden_size'], n_aux * c['target_hidden_size'])
  assert w['lm_head.weight'].shape == (c['draft_vocab_size'], c['hidden_size'])
  d2t = load_file(str(tmp_path / 'head' / 'model.safetensors'))['d2t']
  assert d2t.dtype == torch.int64
  embed = torch.from_numpy(np.array(params['embed'], np.float32))
  g = torch.from_numpy(np.array(feats, np.float32))
  nxt = torch.from_numpy(np.array(tokens))
  with torch.no_grad():
    t_out, kv = midlayer(w, c, g[:, :-1] @ w['fc.weight'].T, embed[nxt[:, 1:]], 0)
    t_logits = draft_logits(w, c, t_out)
    t_out2, _ = midlayer(w, c, t_out[:, -1:], embed[torch.tensor([[4]])], t - 1, past=kv)
    t_logits2 = draft_logits(w, c, t_out2)

  tol = dict(rtol=1e-4, atol=1e-4)
  for ours, theirs in [(out, t_out), (logits, t_logits), (out2, t_out2), (logits2, t_logits2)]:
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), **tol)
  for ours, theirs in [(logits, t_logits), (logits2, t_logits2)]:
    draft = theirs.argmax(-1)
    np.testing.assert_array_equal(
      np.asarray(hp2['vocab_ids'])[np.asarray(ours).argmax(-1)], (draft + d2t[draft]).numpy()
    )
  np.testing.assert_array_equal((torch.arange(len(d2t)) + d2t).numpy(), ids)  # every 3rd id
