"""The few lines a one-prompt run ends with: the answer, the speed, whether speculation
paid on this prompt and why, and where it does pay.

A single --config.prompt is a question, not a benchmark: specjax answers it with
autoregressive decoding and one speculative method (config.quick_method: by default
the q4 self-draft under adaptive control, which first times this CPU's target step,
verifications and draft steps and drafts only at the lengths those costs let pay, or not
at all), and
`lines(summary, records, method)` says what happened, what the costs measured here allow
(`cost_line`) and which CPU and kernel paths measured it. The full method table stays one
flag away (--config.quick=False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Where speculation pays on this machine, measured (BENCHMARKS.md): shown to every
# one-prompt run, since one short chat answer rarely is that place.
WHERE_IT_PAYS = (
  'where it pays: code, which the q4 self-draft predicts at 7-8 tokens a target call '
  '(quantized@adaptive: 2.0x end to end on 8 HumanEval prompts, a 2-core Intel Xeon with '
  'AVX-512; prompt lookup on code edits, 1.7-1.9x; BENCHMARKS.md):\n'
  '  python -m specjax.run --config configs/smollm2.py '
  '--config.prompts=humaneval --config.num_prompts=4 --config.methods=quantized@adaptive'
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


def cost_line(costs: Mapping) -> str:
  """What the costs measured on this CPU allow (one draft's results.json 'costs' entry):
  the acceptance at which speculation starts to pay, or why it cannot pay here. The rule
  is adaptive control's (`AdaptiveConfig.can_pay` and its per-setting `ceilings`) over
  the measured chains, for a draft with nothing to catch up (a draft model's controller
  also charges its catch-up)."""
  from specjax.control import cost_model  # noqa: PLC0415
  from specjax.control.adaptive import AdaptiveConfig  # noqa: PLC0415

  measured = cost_model.Costs(
    batch=costs.get('batch', 1),
    cache_size=costs.get('cache_size', 0),
    target_ms=costs['target_ms'],
    draft_ms={int(g): v for g, v in costs['draft_ms'].items()},
    verify_ms={int(g): v for g, v in costs['verify_ms'].items()},
    overhead_ms={int(g): v for g, v in costs.get('overhead_ms', {}).items()},
  )
  control = AdaptiveConfig.from_costs(measured)
  verify = ', '.join(f'{g + 1}: {measured.units(g)[1]:.2f}' for g in control.gammas)
  said = (
    f'measured here: target step {measured.target_ms:.1f} ms; '
    f'verifying n tokens costs (steps) {verify}'
  )
  if not control.can_pay:
    return (
      f'speculation cannot pay on this CPU: no draft length emits more tokens than its '
      f'verification costs target steps, even if every draft token were accepted ({said}), '
      'so adaptive control kept it off'
    )
  pays = [g for g, top in zip(control.gammas, control.ceilings) if top > 1 + control.hysteresis]
  even = {g: cost_model.break_even_alpha(g, *measured.units(g)) for g in pays}
  gamma = min(even, key=even.get)
  return (
    f'{said}: speculation pays once draft tokens are accepted at alpha >= '
    f'{even[gamma]:.2f} (gamma {gamma})'
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
  draft = method.split('@')[0]
  if draft in summary.get('costs', {}):
    out.append(cost_line(summary['costs'][draft]))
  out.append(WHERE_IT_PAYS)
  out.append('every draft, the cost model and the full table: add --config.quick=False')
  out.append(machine_line())
  return out
