"""specjax from Python in three lines: load a target, generate with a named draft, read what
happened.

  import specjax
  lm = specjax.load()  # SmolLM2-135M-Instruct; or a .gguf file, a Hugging Face directory, 'tiny'
  out = lm.generate('What is the capital of France?', draft='quantized', compare=True)
  print(out.text, out, sep='\\n')

Underneath is the pipeline of `python -m specjax.run` (run_lib: plan, session, costs,
decoding with methods interleaved prompt by prompt, results in a work directory), given
the prompts as text and a model already loaded: there is no second way to decode. An `LM`
keeps its engines, so a second `generate` with the same draft and shapes compiles nothing.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import ml_collections

from specjax import config_lib
from specjax.checkpoints import loader
from specjax.data.parse import Prompt
from specjax.harness import run_config, run_lib

DEFAULT_MODEL = 'smollm2-135m-instruct'
# Config fields each `generate` call sets from its arguments (or that the API fixes): not
# for `load`.
PER_CALL = (
  'prompt', 'prompts', 'num_prompts', 'max_new_tokens', 'temperature', 'top_k', 'top_p',
  'seed', 'batch_size', 'verifier', 'drafts', 'gammas', 'methods', 'measure_costs', 'quick',
  'quick_method', 'resume', 'trees',
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Generation:
  """What `LM.generate` returns: the texts (one per prompt, in order), the method that wrote
  them, its statistics (results.json's summary of that method: acceptance_rate,
  tokens_per_call, decode_tokens_per_second, tokens_per_second, speedup and
  greedy_mismatches when compared, per category under 'categories'), autoregressive
  decoding's when compared, and the work directory holding the whole run."""

  texts: list[str]
  tokens: list[list[int]]
  method: str
  stats: dict
  baseline: dict | None
  workdir: pathlib.Path

  @property
  def text(self) -> str:
    """The first prompt's text (the only one when one prompt was given)."""
    return self.texts[0]

  def __str__(self) -> str:
    s = self.stats
    parts = [f'{self.method}: {s["decode_tokens_per_second"]:.1f} tok/s decoding']
    if s.get('acceptance_rate') is not None:
      parts.append(f'acceptance {s["acceptance_rate"]:.2f}')
    parts.append(f'{s["tokens_per_call"]:.2f} tokens per target call')
    if self.baseline is not None:
      parts.append(
        f'{s["speedup"]:.2f}x autoregressive ({s["decode_speedup"]:.2f}x decoding), '
        f'{s["greedy_mismatches"]} greedy mismatches'
      )
    return ', '.join(parts) + f' (run in {self.workdir})'


def method_name(draft: str | None) -> str:
  """A draft spec or method name as `generate` takes it -> a method name: None is
  autoregressive decoding, a bare draft ('quantized') its adaptive method, and
  '<draft>@<gamma|adaptive|tree>' itself. Unknown ones are one clear error."""
  if draft is None or draft == 'autoregressive':
    return 'autoregressive'
  if not isinstance(draft, str) or not draft.strip():
    raise ValueError(f'draft must be a draft spec or method name, got {draft!r}')
  name = draft.strip() if '@' in draft else f'{draft.strip()}@adaptive'
  run_config.parse_method(name)  # raises with the known drafts and settings
  return name


def prompts_of(prompts: str | Sequence[str]) -> list[Prompt]:
  texts = [prompts] if isinstance(prompts, str) else list(prompts)
  if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
    raise ValueError('prompts must be a non-empty string or a non-empty list of them')
  return [Prompt(id=str(i), text=t, category='prompt') for i, t in enumerate(texts)]


class LM:
  """A loaded target, the engines it has built (one per draft) and the costs it measured,
  reused across calls: an adaptive method's controller is built from the costs, so a second
  call with the same draft and sampling compiles nothing."""

  def __init__(self, model: loader.LoadedModel, config: ml_collections.ConfigDict):
    self.model = model
    self.config = config
    self._engines = {}
    self._costs = {}  # (batch size, sampling) -> {draft spec: Costs}

  def generate(
    self,
    prompts: str | Sequence[str],
    draft: str | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 1,
    verifier: str = 'rejection',
    compare: bool = False,
    workdir: str | None = None,
    verbose: bool = False,
  ) -> Generation:
    """Generates for one prompt or a list of them (chat prompts, the model's template).

    `draft`: any draft spec of the registry ('ngram', 'eagle', 'quantized', 'distilled',
    'truncated:K', a model path, ...) for its adaptive method (draft length chosen every
    iteration from this machine's measured costs, off where drafting does not pay), or a
    method name ('ngram@4', 'quantized@8', 'eagle@4x2x1'); None decodes autoregressively.
    `compare`: also decode autoregressively, interleaved prompt by prompt, for the speedup
    and a greedy identity check. The run's files go to `workdir` (default runs/<UTC time>).
    """
    name = method_name(draft)
    workload = prompts_of(prompts)
    config = self.config.to_dict()
    spec = run_config.parse_method(name).draft
    config.update(
      prompt='',
      num_prompts=len(workload),
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
      seed=seed,
      batch_size=batch_size,
      verifier=verifier,
      drafts=(spec,) if spec else (),
      gammas=(),
      methods=name if spec else '',
      measure_costs=False,  # only adaptive control's drafts are timed, briefly
      quick=False,
    )
    config = ml_collections.ConfigDict(config)  # (values of any type: validation names them)
    plan = run_lib.make_plan(config, workdir, verbose, workload=workload, brief=True)
    if not compare and spec:
      plan = dataclasses.replace(plan, methods=[m for m in plan.methods if m.name == name])
    session = run_lib.open_session(plan, self.model, self._engines)
    self._engines.update(session.engines)
    key = (batch_size, temperature, top_k, top_p)
    decisions = run_lib.decide(plan, session, known=self._costs.get(key))
    self._costs.setdefault(key, {}).update(decisions.costs)
    run = run_lib.decode_run(plan, session, decisions)
    run_lib.write_results(plan, run)
    run_lib.check_strict(plan, run)
    methods = run.summary['methods']
    records = run.records[name]
    return Generation(
      texts=[r['output'] for r in records],
      tokens=[list(r['tokens']) for r in records],
      method=name,
      stats=methods[name],
      baseline=methods.get('autoregressive') if compare and spec else None,
      workdir=plan.out_dir,
    )


def load(
  model: str = DEFAULT_MODEL,
  *,
  dtype: str = 'float32',
  cache_size: int = 1024,
  **overrides,
) -> LM:
  """Loads a target: an asset name ('smollm2-135m-instruct', 'gemma3-270m'), a .gguf file,
  a Hugging Face directory or 'tiny' (a random byte-level model, for tests). `overrides`
  set other fields of configs/smollm2.py (e.g. mesh, adaptive_gammas), checked as the
  command line's are, before the model loads."""
  given = sorted(set(overrides) & set(PER_CALL))
  if given:
    raise ValueError(f'load: {", ".join(given)} are set per call: pass them to generate()')
  config = config_lib.load_config('smollm2.py', 'tiny' if model == 'tiny' else None).to_dict()
  config.update(overrides, model=model, dtype=dtype, cache_size=cache_size)
  config = ml_collections.ConfigDict(config)
  run_config.validate(config)  # unknown fields and bad values: one line, nothing loaded
  return LM(loader.load_model(model, dtype), config)
