"""The few lines a one-prompt run ends with: the answer, the speed, whether speculation
paid on this prompt and why, and where it does pay.

A single --config.prompt is a question, not a benchmark: specjax answers it with
autoregressive decoding and one speculative method (config.quick_method), skips the cost
measurement, and `lines(summary, records, method)` says what happened. The full method
table and the cost model stay one flag away (--config.quick=False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Where speculation pays on this machine, measured (BENCHMARKS.md): shown to every
# one-prompt run, since one short chat answer rarely is that place.
WHERE_IT_PAYS = (
  'where it pays: code edits, whose answers copy much of the prompt (prompt lookup: '
  '1.7-1.9x on a 2-core AMD EPYC with AVX-512, BENCHMARKS.md):\n'
  '  python -m specjax.run --config configs/smollm2.py '
  '--config.prompts=code_edit --config.num_prompts=4 --config.drafts="(\'ngram\',)" '
  '--config.gammas="(8,)"'
)
SHORT = 32  # answers shorter than this leave little to draft
PAYS = 1.05  # a speedup below this is within this machine's run-to-run noise


def reason(m: Mapping) -> str:
  """Why speculation paid or did not on an answer long enough to tell (>= SHORT tokens),
  from one method's summary."""
  speedup, alpha, calls = m['speedup'], m.get('alpha') or 0.0, m['tokens_per_call']
  if speedup >= PAYS:
    return (
      f'the draft was accepted at alpha = {alpha:.2f}, so each target call '
      f'produced {calls:.2f} tokens instead of 1'
    )
  if calls < 1.3:
    return (
      f'the draft was rarely accepted (alpha = {alpha:.2f}, {calls:.2f} tokens per target '
      'call): this answer shares little with what the draft predicts'
    )
  return (
    f'{calls:.2f} tokens per target call did not cover the cost of drafting and of '
    f'verifying {m.get("gamma") or "several"} tokens per call on this CPU'
  )


def machine_line() -> str:
  """Which CPU the figures above were measured on, its ISA flags and the kernel paths."""
  from specjax.kernels import cpu  # noqa: PLC0415

  about = cpu.describe()
  used = [r.get('use') for r in about['products'].values()]
  on_kernel = [u for u in used if u and u != 'xla']
  if about['kernels_requested'] == 'xla':
    paths = 'XLA products throughout (switched off)'
  elif not used:
    paths = 'XLA products throughout'
  else:
    paths = (
      f'{on_kernel[0] if on_kernel else "no"} kernels for {len(on_kernel)} of {len(used)} '
      'product shapes, XLA for the rest (measured on this CPU)'
    )
  return f'measured on: {about["cpu"] or "an unnamed CPU"} ({about["isa_flags"]}); {paths}'


def lines(summary: Mapping, records: Mapping[str, Sequence[Mapping]], method: str) -> list[str]:
  """The answer (the autoregressive text; greedy speculative output is the same), the
  speed of both methods, the verdict and its reason, and where speculation pays."""
  base = records['autoregressive'][-1]
  m, ar = summary['methods'][method], summary['methods']['autoregressive']
  out = [base['output'].strip(), '']
  same = all(a['tokens'] == b['tokens'] for a, b in zip(records[method], records['autoregressive']))
  identity = (
    'the same text as autoregressive decoding'
    if same
    else f'text differs from autoregressive decoding ({m.get("near_ties", 0)} near-ties)'
  )
  if summary.get('temperature', 0) > 0:
    identity = "sampled (its own text, distributed as the target's)"
  out.append(
    f'{method}: {m["tokens_per_second"]:.1f} tok/s against autoregressive '
    f'{ar["tokens_per_second"]:.1f} tok/s ({m["speedup"]:.2f}x, prefill included), '
    f'{identity}'
  )
  n = base['new_tokens']
  if n < SHORT:
    out.append(
      f"speculation on this prompt: too short to tell ({n} tokens): the prompt's prefill "
      f'is most of the time, there is little to draft, and {m["speedup"]:.2f}x is mostly noise'
    )
  else:
    verdict = 'paid' if m['speedup'] >= PAYS else 'did not pay'
    out.append(f'speculation {verdict} on this prompt: {reason(m)}')
  out.append(WHERE_IT_PAYS)
  out.append('every draft, the cost model and the full table: add --config.quick=False')
  out.append(machine_line())
  return out
