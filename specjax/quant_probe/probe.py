"""The probe: each candidate GGUF file against the reference, per task category, a verdict
(sound or broken) and for a broken file the tensor that breaks it.

  1. Checks before anything heavy: files exist and are GGUF, the candidates' architecture,
     shapes and vocabulary are the reference's, the reference is not quantised below 8
     bits (unless config.allow_quantized_reference), the --config.make types are known.
  2. Calibration: the reference re-quantised to each config.make type (files.requantize),
     probed like a candidate; sound by construction, they give what each type costs in KL.
  3. Fidelity (fidelity.py): the reference answers each prompt greedily; per category the
     candidate's KL, top-1 agreement, acceptance (greedy and at T = 1), tokens per call at
     config.gamma and first greedy divergence.
  4. Static suspects (static.py): every tensor's error against what its type predicts.
  5. Verdict: broken when a tensor is a static suspect, or the KL exceeds
     config.kl_factor x what its type costs (calibrated; the nearest calibrated type by bits
     per weight otherwise). A broken file without a static suspect gets a dynamic one: the
     candidate's layers swapped into the reference one at a time, the layer whose swap
     raises KL most.
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import numpy as np

from specjax.checkpoints import gguf as gguf_lib
from specjax.checkpoints import loader
from specjax.data import prompts as prompts_lib
from specjax.formats.gguf_file import open_reader
from specjax.quant_probe import fidelity, files, speed, static

LOW_BITS = 8.0  # a reference below this many bits per weight is itself a quantisation


def dominant_type(file) -> str:
  """The type holding most bytes of a GGUF file's layer matrices (the embedding and output
  head, often kept at 8 bits or more, only where there are no layers)."""
  by: dict[str, int] = {}
  matrices = [t for t in file.tensors if len(t.shape) == 2]
  layers = [t for t in matrices if t.name.startswith('blk.')] or matrices
  for t in layers:
    by[t.tensor_type.name] = by.get(t.tensor_type.name, 0) + t.n_bytes
  return max(by, key=by.get) if by else 'F32'


def check_inputs(config) -> tuple[pathlib.Path, list[pathlib.Path]]:
  """One ValueError / FileNotFoundError naming the problem, before anything loads."""
  if not config.reference:
    raise ValueError(
      'config.reference: expected the reference model (a .gguf file, a Hugging Face '
      'directory or an asset name)'
    )
  reference = _path(config.reference, 'reference')
  candidates = [_path(c, 'candidates') for c in config.candidates]
  if not candidates and not config.make:
    raise ValueError('config.candidates = (): expected GGUF files to probe (or config.make)')
  bad = [m for m in config.make if m not in files.MAKE_TYPES]
  if bad:
    raise ValueError(
      f'config.make: unknown type {bad[0]!r}; expected some of {list(files.MAKE_TYPES)}'
    )
  if reference.is_dir():  # a Hugging Face directory: float weights, no GGUF metadata
    if config.make:
      raise ValueError('config.make re-quantises a GGUF reference; this one is a directory')
    ref_cfg, shapes = loader.peek_config(str(reference)), None
  else:
    ref = open_reader(reference)
    ref_cfg = gguf_lib.config_from_reader(ref, reference)
    kind = dominant_type(ref)
    bits = files.bits_per_weight(_type(kind))
    if bits < LOW_BITS and not config.allow_quantized_reference:
      raise ValueError(
        f'{reference.name} is itself quantised ({kind}, {bits:.1f} bits per weight): a '
        'reference should be float32, bfloat16, float16 or q8_0; to probe against it anyway '
        'set --config.allow_quantized_reference=True'
      )
    shapes = {t.name: tuple(t.shape) for t in ref.tensors}
  for c in candidates:
    _check_candidate(c, reference, ref_cfg, shapes)
  return reference, candidates


def _check_candidate(c: pathlib.Path, reference: pathlib.Path, ref_cfg, shapes) -> None:
  f = open_reader(c)
  cfg = gguf_lib.config_from_reader(f, c)
  have = (cfg.arch, cfg.n_layers, cfg.d_model, cfg.vocab_size)
  want = (ref_cfg.arch, ref_cfg.n_layers, ref_cfg.d_model, ref_cfg.vocab_size)
  if have != want:
    raise ValueError(
      f'candidate {c.name} is {cfg.arch} with {cfg.n_layers} layers, width {cfg.d_model}, '
      f'vocabulary {cfg.vocab_size}; the reference {reference.name} is {ref_cfg.arch} with '
      f'{ref_cfg.n_layers}, {ref_cfg.d_model}, {ref_cfg.vocab_size}: not the same model'
    )
  if shapes is not None:
    odd = [t.name for t in f.tensors if shapes.get(t.name) != tuple(t.shape)]
    if odd:
      raise ValueError(f"candidate {c.name}: tensor {odd[0]} is not shaped as the reference's")


def _path(spec: str, field: str) -> pathlib.Path:
  if spec in loader.MODEL_ASSETS:
    from specjax.data import assets

    return assets.fetch(spec)
  path = pathlib.Path(spec)
  if field == 'reference' and path.is_dir():
    if not (path / 'config.json').is_file():
      raise FileNotFoundError(f'config.reference: no config.json in the directory {spec}')
    return path
  if not path.is_file():
    raise FileNotFoundError(f'config.{field}: GGUF file not found: {spec}')
  if path.suffix != '.gguf':
    raise ValueError(f'config.{field} = {spec!r}: expected a .gguf file')
  return path


def _type(name: str):
  import gguf

  return gguf.GGMLQuantizationType[name]


def pick_prompts(spec: str, n: int) -> list:
  """n prompts spread over the set's categories (round robin, in the set's order)."""
  by: dict[str, list] = {}
  for p in prompts_lib.load_prompts(spec):
    by.setdefault(p.category or 'all', []).append(p)
  out, queues = [], list(by.values())
  while len(out) < n and any(queues):
    for q in queues:
      if q and len(out) < n:
        out.append(q.pop(0))
  return out


def expected_kl(calibrated: dict[str, float], type_name: str) -> float | None:
  """KL a sound file of `type_name` costs: its calibration's, else the nearest by bits."""
  if type_name in calibrated:
    return calibrated[type_name]
  if not calibrated:
    return None
  bits = files.bits_per_weight(_type(type_name))
  nearest = min(calibrated, key=lambda t: abs(files.bits_per_weight(_type(t)) - bits))
  # a type with fewer bits costs more: scale by 4x per bit (KL ~ error^2 ~ 4^-bits)
  return calibrated[nearest] * 4.0 ** (files.bits_per_weight(_type(nearest)) - bits)


class Probe:
  """The reference loaded once, its answers, and what probing a file needs."""

  def __init__(self, config, reference: pathlib.Path, say):
    from specjax.decode.engine import Engine

    self.config, self.say = config, say
    self.reference_path = reference
    self.ref = loader.load_model(str(reference))
    if reference.is_dir():
      self.reference = static.tree_reference(self.ref.cfg, self.ref.params)
    else:
      self.reference = static.gguf_reference(open_reader(reference), self.ref.cfg)
    self.ref.params = jax.device_put(self.ref.params)  # once: every comparison reads them
    tok = self.ref.tokenizer
    self.prompts = pick_prompts(config.prompts, config.num_prompts)
    self.encoded = [tok.encode_chat(p.text) for p in self.prompts]
    cache = max(len(e) for e in self.encoded) + config.max_new_tokens + 8
    engine = Engine(self.ref.params, self.ref.cfg, eos_id=tok.eos_id, cache_size=cache)
    say(f'reference {reference.name}: answering {len(self.prompts)} prompts greedily')
    out = engine.generate(self.encoded, max_new_tokens=config.max_new_tokens)
    self.answers = [list(t) for t in out.tokens]
    self.timer = speed.Timer(self.ref, config.gamma, cache) if config.speed else None

  def fidelity(self, params, prompts=None, cfg=None) -> list:
    idx = range(len(self.prompts)) if prompts is None else prompts
    return fidelity.compare(
      self.ref.cfg,
      self.ref.params,
      params,
      [self.encoded[i] for i in idx],
      [self.answers[i] for i in idx],
      cand_cfg=cfg,
    )

  def categories(self, positions) -> dict:
    out = {'all': fidelity.summarize(positions, self.config.gamma)}
    cats = sorted({p.category or 'all' for p in self.prompts})
    if len(cats) > 1:
      for cat in cats:
        pick = [x for x, p in zip(positions, self.prompts) if (p.category or 'all') == cat]
        out[cat] = fidelity.summarize(pick, self.config.gamma)
    return out

  def _swapped_kl(self, cand_params, parts, prompts) -> float:
    params = dict(self.ref.params, layers=list(self.ref.params['layers']))
    for part in parts:
      if isinstance(part, int):
        params['layers'][part] = cand_params['layers'][part]
      else:
        params[part] = cand_params[part]
    return fidelity.summarize(self.fidelity(params, prompts), self.config.gamma)['kl']

  def layer_swap(self, cand_params, prompts) -> tuple[str, float, list]:
    """The part of the candidate (a layer, its embedding, final norm or head) whose swap
    into the reference raises KL most, by bisection: the candidate's parts in halves, each
    half swapped into the reference, the worse half kept. (name, its KL, the steps)."""
    parts = list(range(self.ref.cfg.n_layers))
    parts += [k for k in ('embed', 'final_norm', 'lm_head') if k in cand_params]
    steps, kl = [], None
    while len(parts) > 1:
      half = len(parts) // 2
      a, b = parts[:half], parts[half:]
      kl_a = self._swapped_kl(cand_params, a, prompts)
      kl_b = self._swapped_kl(cand_params, b, prompts)
      steps.append((_part_name(a), kl_a, _part_name(b), kl_b))
      parts, kl = (a, kl_a) if kl_a >= kl_b else (b, kl_b)
    return _part_name(parts), kl, steps

  def probe(self, path: pathlib.Path, calibrated: dict, calibration: bool = False) -> dict:
    start = time.time()
    file = open_reader(path)
    cand = loader.load_model(str(path))
    cand.params = jax.device_put(cand.params)
    by_cat = self.categories(self.fidelity(cand.params, cfg=cand.cfg))
    found = static.compare_files(self.reference, file, static.qk_heads(self.ref.cfg))
    suspects = sorted((f for f in found if f.suspect), key=lambda f: -f.ratio)
    kind = dominant_type(file)
    expect = None if calibration else expected_kl(calibrated, kind)
    kl = by_cat['all']['kl']
    costs = self.timer.costs(path, kind, cand) if self.timer else {'why': 'config.speed off'}
    speed.speedups(costs, by_cat)
    too_far = expect is not None and kl > self.config.kl_factor * expect + 1e-4
    broken = bool(suspects) or too_far
    suspect = None
    if suspects:
      f = suspects[0]
      suspect = {
        'tensor': f.tensor.removesuffix('.weight'),
        'why': f.why,
        'error': f.error,
        'predicted': f.predicted,
        'how': 'static',
      }
    elif broken and self.config.dynamic:
      self.say(f'{path.name}: no tensor stands out; swapping its layers into the reference')
      prompts = list(range(min(4, len(self.prompts))))
      name, layer_kl, steps = self.layer_swap(cand.params, prompts)
      suspect = {
        'tensor': name,
        'why': f"swapped alone into the reference: KL {layer_kl:.4f} of the file's {kl:.4f}",
        'how': 'layer swap (bisection)',
        'steps': steps,
      }
    return {
      'file': str(path),
      'type': kind,
      'verdict': 'broken' if broken else 'sound',
      'calibration': calibration,
      'expected_kl': expect,
      'suspect': suspect,
      'draft_costs': costs,
      'figures': by_cat,
      'tensors': [vars(f) | {'suspect': f.suspect} for f in found],
      'seconds': time.time() - start,
    }


GLOBAL_NAMES = {'embed': 'token_embd', 'final_norm': 'output_norm', 'lm_head': 'output'}


def _part_name(parts) -> str:
  names = [f'blk.{p}' if isinstance(p, int) else GLOBAL_NAMES[p] for p in parts]
  return names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'


def line(result: dict) -> str:
  a = result['figures']['all']
  name = pathlib.Path(result['file']).name + (' (calibration)' if result['calibration'] else '')
  text = (
    f'{name}: {result["verdict"]}  '
    f'acceptance {a["acceptance_t1"]:.2f}  KL {a["kl"]:.4f}  top-1 {a["top1"]:.2f}'
  )
  if a.get('speedup_greedy') is not None:
    text += f'  as a draft {a["speedup_greedy"]:.2f}x (greedy, gamma {a["gamma"]})'
  s = result['suspect']
  if s is not None:
    text += f'  [suspect: {s["tensor"]} ({s["why"]})]'
  return text


def write_outputs(out_dir: pathlib.Path, results: list[dict], meta: dict) -> None:
  from specjax.bench import provenance
  from specjax.harness import report

  out_dir.mkdir(parents=True, exist_ok=True)
  report.write_atomic(
    out_dir / 'results.json',
    json.dumps({**meta, 'candidates': results, 'provenance': provenance.provenance()}, indent=2),
  )
  rows = [
    'file,type,verdict,category,kl,top1,acceptance_greedy,acceptance_t1,'
    'tokens_per_call_greedy,tokens_per_call_t1,speedup_greedy,speedup_t1,'
    'first_divergence_median,suspect'
  ]
  for r in results:
    s = r['suspect']['tensor'] if r['suspect'] else ''
    for cat, a in r['figures'].items():
      rows.append(
        f'{pathlib.Path(r["file"]).name},{r["type"]},{r["verdict"]},{cat},{a["kl"]:.6f},'
        f'{a["top1"]:.4f},{a["acceptance_greedy"]:.4f},{a["acceptance_t1"]:.4f},'
        f'{a["tokens_per_call_greedy"]:.3f},{a["tokens_per_call_t1"]:.3f},'
        f'{_num(a["speedup_greedy"])},{_num(a["speedup_t1"])},'
        f'{a["first_divergence_median"]:.1f},{s}'
      )
  report.write_atomic(out_dir / 'results.csv', '\n'.join(rows) + '\n')
  plot(out_dir, results)


def _num(x) -> str:
  return '' if x is None else f'{x:.3f}'


def plot(out_dir: pathlib.Path, results: list[dict]) -> None:
  from matplotlib.figure import Figure

  cats = [c for c in results[0]['figures'] if c != 'all'] or ['all']
  fig = Figure(figsize=(max(6, 1.2 * len(cats) + 3), 4))
  ax = fig.subplots()
  width = 0.8 / len(results)
  for i, r in enumerate(results):
    ys = [r['figures'][c]['acceptance_t1'] for c in cats]
    xs = np.arange(len(cats)) + i * width
    ax.bar(xs, ys, width, label=f'{pathlib.Path(r["file"]).name} ({r["verdict"]})')
  ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, cats, rotation=30, ha='right')
  ax.set_ylabel('acceptance at T = 1 (1 - TV)')
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out_dir / 'acceptance_by_category.png', dpi=120)

  names = sorted({t['tensor'] for r in results for t in r['tensors']})
  grid = np.full((len(results), len(names)), np.nan)
  col = {n: j for j, n in enumerate(names)}
  for i, r in enumerate(results):
    for t in r['tensors']:
      grid[i, col[t['tensor']]] = np.log10(max(t['error'] / max(t['predicted'], 1e-12), 1e-3))
  fig = Figure(figsize=(12, 1 + 0.4 * len(results)))
  ax = fig.subplots()
  im = ax.imshow(grid, aspect='auto', cmap='magma', vmin=-1, vmax=2)
  ax.set_yticks(range(len(results)), [pathlib.Path(r['file']).name for r in results], fontsize=7)
  ax.set_xlabel(f'tensor ({len(names)}, by name)')
  ax.set_xticks([])
  fig.colorbar(im, label='log10(error / what its type predicts)')
  fig.tight_layout()
  fig.savefig(out_dir / 'tensor_errors.png', dpi=120)


def main(config, workdir: str | None, say=print) -> list[dict]:
  reference, candidates = check_inputs(config)
  out_dir = pathlib.Path(workdir or f'runs/quant_probe_{time.strftime("%Y%m%d_%H%M%S")}')
  out_dir.mkdir(parents=True, exist_ok=True)
  made = []
  for name in config.make:
    dst = out_dir / 'make' / f'{reference.stem}.{name}.gguf'
    dst.parent.mkdir(exist_ok=True)
    if not dst.is_file():
      say(f'writing {dst.name} (the reference re-quantised to {name})')
      files.requantize(reference, dst, name)
    made.append(dst)
  probe = Probe(config, reference, say)
  results, calibrated = [], {}
  for path in made:
    r = probe.probe(path, calibrated, calibration=True)
    calibrated[r['type']] = r['figures']['all']['kl']
    results.append(r)
    say(f'calibration {path.name}: KL {calibrated[r["type"]]:.4f} ({r["seconds"]:.0f} s)')
  for path in candidates:
    r = probe.probe(path, calibrated)
    results.append(r)
    say(f'probed {path.name} ({r["seconds"]:.0f} s)')
  meta = {
    'reference': str(reference),
    'prompts': config.prompts,
    'num_prompts': len(probe.prompts),
    'max_new_tokens': config.max_new_tokens,
    'calibrated_kl': calibrated,
    'kl_factor': config.kl_factor,
  }
  write_outputs(out_dir, results, meta)
  for r in results:
    say(line(r))
  say(f'results in {out_dir}')
  return results
