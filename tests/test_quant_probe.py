"""The quantisation probe (specjax/quant_probe/): real defects made from the shipped
SmolLM2-135M-Instruct GGUF on the fly, each judged broken with the right suspect; the file
itself and its proper re-quantisations judged sound; bad input as one line."""

import dataclasses

import numpy as np
import pytest

from specjax import config_lib
from specjax.checkpoints import gguf as gguf_lib
from specjax.data import assets
from specjax.formats.gguf_file import open_reader
from specjax.quant_probe import defects, fidelity, files, probe, speed, static
from tests import cli
from tests.test_checkpoints import write_gguf

ROOT = __file__.rsplit('/tests/', 1)[0]

# (file name, how to break it, the suspect it must name, words its reason must hold)
DEFECTS = (
  ('scales', lambda s, d: defects.scales(s, d, 'blk.12.ffn_up.weight', 1.5), 'blk.12.ffn_up',
   'block scales'),
  ('exchange', lambda s, d: defects.exchange(s, d, 'blk.7.attn_q.weight', 'blk.7.attn_output.weight'),  # noqa: E501
   'blk.7.attn_', 'exchanged'),
  ('nibbles', lambda s, d: defects.nibbles(s, d, 'blk.20.ffn_down.weight'), 'blk.20.ffn_down',
   'wrong order'),
  ('unpermuted', lambda s, d: defects.unpermuted(s, d, 'blk.3.attn_k.weight', 3), 'blk.3.attn_k',
   'not permuted'),
  ('rope', lambda s, d: defects.metadata(s, d, 'llama.rope.freq_base', 10000.0),
   'metadata llama.rope.freq_base', 'where the reference has 100000.0'),
)  # fmt: skip


@pytest.fixture(scope='module')
def shipped():
  path = assets.fetch('smollm2-135m-instruct')
  return path, open_reader(path), gguf_lib.config_from_reader(open_reader(path), path)


@pytest.fixture(scope='module')
def broken(shipped, tmp_path_factory):
  src = shipped[0]
  d = tmp_path_factory.mktemp('defects')
  return {name: make(src, d / f'{name}.gguf') for name, make, _, _ in DEFECTS}


@pytest.mark.parametrize('name,suspect,why', [(n, s, w) for n, _, s, w in DEFECTS])
def test_each_defect_is_found_statically_with_its_tensor(shipped, broken, name, suspect, why):
  _, ref, cfg = shipped
  reference = static.gguf_reference(ref, cfg)
  found = static.compare_files(reference, open_reader(broken[name]), static.qk_heads(cfg))
  suspects = sorted((f for f in found if f.suspect), key=lambda f: -f.ratio)
  assert suspects and suspects[0].tensor.startswith(suspect), [vars(f) for f in suspects[:3]]
  assert why in suspects[0].why
  # the defect touches one tensor (two for the exchange), nothing else is suspected
  assert len(suspects) == (2 if name == 'exchange' else 1)


def test_sound_files_have_no_suspect(shipped, tmp_path):
  src, ref, cfg = shipped
  copy = files.patched_copy(src, tmp_path / 'copy.gguf', {})
  q8 = files.requantize(src, tmp_path / 'q8.gguf', 'q8_0')
  q5 = files.requantize(src, tmp_path / 'q5.gguf', 'q5_1')
  reference = static.gguf_reference(ref, cfg)
  for path in (copy, q8, q5):
    found = static.compare_files(reference, open_reader(path), static.qk_heads(cfg))
    assert not [f for f in found if f.suspect], path
    assert len(found) == len(ref.tensors)
  q8_errors = [
    f.error for f in static.compare_files(reference, open_reader(q8), {}) if f.type == 'Q8_0'
  ]
  assert 0 < np.median(q8_errors) < 0.02  # q8_0's rounding, as its type predicts


def test_a_tree_reference_is_laid_out_as_gguf_stores_it(shipped):
  """A Hugging Face reference is read into specjax's tree; in GGUF's names and layout it
  is the GGUF file's own tensors (Q/K rows permuted back, matrices (out, in))."""
  from specjax.checkpoints import loader

  path, ref, cfg = shipped
  model = loader.load_model(str(path))
  tree = static.tree_reference(model.cfg, model.params)
  stored = static.gguf_reference(ref, cfg)
  assert set(tree.arrays) == set(stored.arrays)
  for name, w in stored.arrays.items():
    np.testing.assert_allclose(tree.arrays[name], w, rtol=0, atol=1e-6, err_msg=name)


def test_a_hugging_face_reference_compares_its_config(tmp_path):
  from specjax import testing
  from specjax.checkpoints import hf

  cfg, params = testing.tiny_model(vocab_size=64, d_model=64, head_dim=16, ffn_dim=128)
  params = jax_to_numpy(params)
  gguf_file = write_gguf(tmp_path / 'tiny-q8_0.gguf', cfg, params, files.MAKE_TYPES['q8_0'])
  broken = write_gguf(
    tmp_path / 'tiny-bad.gguf',
    dataclasses.replace(cfg, rope_base=500.0),
    params,
    files.MAKE_TYPES['q8_0'],
  )
  hf.export_hf(tmp_path / 'hf', cfg, params)
  reference = static.tree_reference(cfg, params)
  heads = static.qk_heads(cfg)
  sound = static.compare_files(reference, open_reader(gguf_file), heads)
  assert sound and not [f for f in sound if f.suspect]
  bad = [f for f in static.compare_files(reference, open_reader(broken), heads) if f.suspect]
  assert [f.tensor for f in bad] == ['config rope_base'] and '500.0' in bad[0].why


def test_fidelity_figures_by_hand():
  top1 = np.array([1, 1, 0, 1, 1, 1, 1, 0], bool)
  # gamma 2: [1 1 | +1] [0 -> +1] ... walks: t=0 run 2 -> t=3; t=3 run 2 -> t=6; t=6 run 1,
  # t=7 is a miss -> t=8
  assert fidelity.greedy_calls(top1, 2) == 3
  assert fidelity.greedy_calls(np.ones(8, bool), 3) == 2
  assert (
    fidelity.first_divergence(top1) == 2 and fidelity.first_divergence(np.ones(3, bool)) is None
  )
  assert fidelity.sampled_tokens_per_call(0.5, 2) == pytest.approx(1.75)
  pos = [fidelity.Positions(np.array([0.0, 0.2]), np.array([True, False]), np.array([1.0, 0.6]))]
  s = fidelity.summarize(pos, 4)
  assert s['kl'] == pytest.approx(0.1) and s['top1'] == 0.5 and s['acceptance_t1'] == 0.8


def test_expected_kl_by_type():
  cal = {'Q8_0': 0.001, 'Q4_0': 0.3}
  assert probe.expected_kl(cal, 'Q8_0') == 0.001
  assert probe.expected_kl(cal, 'Q5_0') > 0.001  # nearest Q4_0 (4.5 bpw), one more bit
  assert probe.expected_kl(cal, 'Q5_0') == pytest.approx(0.3 / 4 ** (5.5 - 4.5))
  assert probe.expected_kl({}, 'Q4_0') is None


def test_a_kernel_type_is_timed_as_a_draft_once_per_layout(tmp_path):
  """q8_0 candidates are timed as drafts of the reference (one timing per layout of
  types: two files of the same types share it); a type without a kernel is not timed."""
  import types

  from specjax import testing
  from specjax.checkpoints import gguf as gguf_io

  cfg, params = testing.tiny_model(vocab_size=64, d_model=64, head_dim=16, ffn_dim=128)
  ref = types.SimpleNamespace(cfg=cfg, params=params)
  timer = speed.Timer(ref, gamma=2, cache_size=64, repeats=1)
  q8 = write_gguf(tmp_path / 'a.gguf', cfg, jax_to_numpy(params), files.MAKE_TYPES['q8_0'])
  same = write_gguf(tmp_path / 'b.gguf', cfg, jax_to_numpy(params), files.MAKE_TYPES['q8_0'])
  cand = types.SimpleNamespace(cfg=cfg, params=gguf_io.load_gguf(q8, progress=False)[1])
  costs = timer.costs(q8, 'Q8_0', cand)
  assert costs['draft'] > 0 and costs['verify'] > 0 and costs['timed'] == 'a.gguf'
  assert timer.costs(same, 'Q8_0', cand) == costs  # same layout: not timed again
  assert 'no kernel for Q5_0' in timer.costs(q8, 'Q5_0', cand)['why']
  figures = {'all': {'tokens_per_call_greedy': 3.0, 'tokens_per_call_t1': 2.0}}
  speed.speedups({'draft': 0.5, 'verify': 1.5}, figures)
  assert figures['all']['speedup_greedy'] == 1.5 and figures['all']['speedup_t1'] == 1.0
  assert speed.speedups({'why': '-'}, figures)['all']['speedup_t1'] is None


def _config(**kw):
  c = config_lib.load_config('quant_probe.py', 'demo')
  c.num_prompts, c.max_new_tokens, c.make, c.speed = 4, 24, ('q8_0',), False
  for k, v in kw.items():
    c[k] = v
  return c


@pytest.mark.slow
def test_probe_judges_files_and_writes_results(broken, shipped, tmp_path, capsys):
  config = _config(candidates=(str(broken['exchange']), str(broken['rope']), str(shipped[0])))
  results = probe.main(config, str(tmp_path))
  verdicts = {r['file'].rsplit('/', 1)[-1]: r for r in results}
  assert verdicts['exchange.gguf']['verdict'] == 'broken'
  assert verdicts['rope.gguf']['verdict'] == 'broken'
  assert verdicts['rope.gguf']['suspect']['tensor'] == 'metadata llama.rope.freq_base'
  # the candidate runs with its own settings: its RoPE base shows in what it predicts
  assert verdicts['rope.gguf']['figures']['all']['kl'] > 0.01
  same = verdicts['SmolLM2-135M-Instruct.Q4_1.gguf']
  assert same['verdict'] == 'sound' and same['figures']['all']['kl'] < 1e-6
  assert same['figures']['all']['top1'] == 1.0 and same['suspect'] is None
  q8 = verdicts['SmolLM2-135M-Instruct.Q4_1.q8_0.gguf']
  assert q8['calibration'] and q8['verdict'] == 'sound' and q8['figures']['all']['top1'] > 0.8
  lines = capsys.readouterr().out.splitlines()
  assert any(
    line.startswith('exchange.gguf: broken  acceptance ') and '[suspect: blk.7.attn_' in line
    for line in lines
  )
  for name in ('results.json', 'results.csv', 'acceptance_by_category.png', 'tensor_errors.png'):
    assert (tmp_path / name).is_file()
  csv = (tmp_path / 'results.csv').read_text().splitlines()
  assert csv[0].startswith('file,type,verdict,category,kl,top1')
  assert len(csv) > 1 + len(results)  # overall and per category


@pytest.mark.slow
def test_a_defect_static_checks_miss_is_found_by_swapping_layers(broken, tmp_path, monkeypatch):
  monkeypatch.setattr(static, 'SUSPECT_RATIO', float('inf'))  # static checks see nothing
  # what a q4_1 file should cost, as a q4_1 calibration measures it (0.0000: the reference's
  # own blocks), without writing and probing one
  monkeypatch.setattr(probe, 'expected_kl', lambda calibrated, kind: 1e-4)
  config = _config(candidates=(str(broken['scales']),), num_prompts=2, make=())
  (result,) = probe.main(config, str(tmp_path), say=lambda *a: None)
  assert result['verdict'] == 'broken'
  assert (
    result['suspect']['how'].startswith('layer swap') and result['suspect']['tensor'] == 'blk.12'
  )


def _run(*args):
  return cli.one_line_error('specjax.quant_probe', '--config', 'configs/quant_probe.py', *args)


def test_bad_input_is_one_line_before_any_work(shipped, tmp_path):
  src = str(shipped[0])
  assert 'expected the reference model' in _run()
  line = _run(f'--config.reference={src}', f"--config.candidates=('{src}',)")
  assert 'is itself quantised (Q4_1' in line and 'allow_quantized_reference=True' in line
  line = _run(
    f'--config.reference={src}',
    '--config.allow_quantized_reference=True',
    "--config.make=('q3_x',)",
  )
  assert "unknown type 'q3_x'" in line
  truncated = tmp_path / 'cut.gguf'
  truncated.write_bytes(shipped[0].read_bytes()[:100_000])
  line = _run(f'--config.reference={src}', '--config.allow_quantized_reference=True',
              f"--config.candidates=('{truncated}',)")  # fmt: skip
  assert 'cut.gguf' in line and 'truncated or corrupt' in line
  missing = _run(f'--config.reference={tmp_path}/none.gguf')
  assert 'GGUF file not found' in missing


def test_a_candidate_of_another_model_is_refused(shipped, tmp_path):
  from specjax import testing

  cfg, params = testing.tiny_model()
  other = write_gguf(tmp_path / 'tiny.gguf', cfg, jax_to_numpy(params))
  config = _config(candidates=(str(other),))
  with pytest.raises(
    ValueError, match='tiny.gguf is llama with 2 layers, width 32.*not the same model'
  ):
    probe.check_inputs(config)


def jax_to_numpy(tree):
  import jax

  return jax.tree_util.tree_map(np.asarray, tree)
