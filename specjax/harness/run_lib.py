"""The work behind `python -m specjax.run`: orchestration only, importable from notebooks.

`main` is a pipeline of typed stages: `make_plan` (every check of the config, before
anything loads; the workload, the work directory) -> `open_session` (the target, the
prompts' ids, one engine per draft) -> `decide` (measured costs, adaptive controllers,
hopeless drafts skipped) -> `decode_run` (every method, interleaved batch by batch, then the
summary) -> the reporters `Plan.reporters` picks (results files, leaderboard, verdict or
table). A new feature adds a plan field or a reporter, not a branch in `main`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from specjax import pairs, registry
from specjax.bench import costs as costs_lib
from specjax.bench import leaderboard, metrics
from specjax.checkpoints import loader
from specjax.control.adaptive import AdaptiveConfig
from specjax.control.cost_model import Costs
from specjax.core.contract import TreeDrafter
from specjax.core.sampling import SamplingConfig
from specjax.core.tree import TreeSpec
from specjax.data import prompts as prompts_lib
from specjax.data import specbench
from specjax.decode.engine import Engine, NonFiniteLogits
from specjax.decode.method import Adaptive
from specjax.drafters import ModelDrafter
from specjax.drafters.multilevel import MultiLevelDrafter
from specjax.harness import pair_check, report, run_config, verdict
from specjax.models import sharding as sharding_lib

COST_GAMMAS = (1, 2, 4)  # always measured (with every gamma a method uses) for the cost model


RUN_FILES = ('generations.jsonl', report.PARTIAL, 'results.json')  # a run's, finished or not


def make_workdir(workdir: str | None, resume: bool = False) -> pathlib.Path:
  """Creates the work directory (default runs/<UTC time>, made unique) and checks it can
  be written; one that already holds a run's results is an error, never overwritten
  (`resume`: one holding an interrupted run's partial records is what is wanted)."""
  if not workdir:
    now = datetime.datetime.now(datetime.timezone.utc)
    base = os.path.join('runs', now.strftime('%Y%m%d-%H%M%S'))
    workdir = next(
      f'{base}{suffix}'
      for suffix in ('', *(f'-{i}' for i in range(2, 10_000)))
      if not os.path.exists(f'{base}{suffix}')
    )
  path = pathlib.Path(workdir)
  held = [name for name in RUN_FILES if (path / name).exists()]
  if resume and not (path / report.PARTIAL).exists():
    raise ValueError(
      f'config.resume=True but {str(path)!r} holds no interrupted run ({report.PARTIAL}): '
      + ('it finished' if held else 'pass the work directory of the interrupted run')
    )
  if held and not resume:
    raise ValueError(
      f'work directory {str(path)!r} already holds a run ({", ".join(held)}): pass another '
      '--workdir, or remove that one first'
    )
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / '.write_test'
    probe.write_text('ok')
    probe.unlink()
  except OSError as e:
    raise ValueError(f'work directory {str(path)!r} cannot be written: {e.strerror}') from None
  return path


def build_engines(
  config, model: loader.LoadedModel, methods, built: dict[str, Engine] | None = None
) -> dict[str, Engine]:
  """One engine per draft ('': the target's own, always), all sharing the target's arrays;
  `built` (engines of an earlier session of the same model and config) are reused, with
  what they compiled."""
  built = built or {}
  wanted = dict.fromkeys(['', *(m.draft for m in methods)])
  if all(spec in built for spec in wanted):
    return {spec: built[spec] for spec in wanted}
  partition = run_config.mesh_rules(config)
  if '' in built:  # the target's arrays already on the devices: no second copy
    mesh, params = built[''].mesh, built[''].params
  else:
    mesh = None
    if config.mesh.data * config.mesh.model > 1:
      mesh = sharding_lib.make_mesh(config.mesh.data, config.mesh.model)
    rules = partition['rules'] + sharding_lib.DEFAULT_RULES
    params = (
      sharding_lib.shard_params(model.params, mesh, rules)
      if mesh is not None
      else jax.device_put(model.cfg.family.fuse(model.params))  # once for every engine
    )
  engines = {}
  for spec in wanted:
    if spec in built:
      engines[spec] = built[spec]
      continue
    drafter, draft_params = (
      registry.build_draft(spec, model, config.dtype) if spec else (None, None)
    )
    engines[spec] = Engine(
      params,
      model.cfg,
      eos_id=model.tokenizer.eos_id,
      cache_size=config.cache_size,
      mesh=mesh,
      drafter=drafter,
      draft_params=draft_params,
      **partition,
    )
  return engines


def describe_mesh(engines) -> str:
  """One line: the mesh and how the largest target matrices and the drafts are split."""
  base = engines['']
  mesh = base.mesh
  layer = base.params['layers'][0]
  parts = [f'{name} {layer[name].sharding.spec}' for name in ('wq', 'w_down') if name in layer]
  parts.append(f'embed {base.params["embed"].sharding.spec}')
  for spec, e in engines.items():
    if spec and e.draft_params is not None:
      leaves = jax.tree.leaves(e.draft_params)
      split = sum(1 for x in leaves if any(a is not None for a in x.sharding.spec))
      parts.append(f'draft {spec}: {split}/{len(leaves)} tensors split')
  shape = ' x '.join(f'{a}={n}' for a, n in mesh.shape.items())
  return f'mesh {shape} over {mesh.size} {mesh.devices.flat[0].platform} devices: ' + ', '.join(
    parts
  )


def adaptive_trees_of(config, engine, methods, spec: str) -> tuple:
  """The config's adaptive trees this draft's adaptive method can draft (static shapes;
  prompt lookup, which drafts only tries, keeps to chains)."""
  if not any(m.is_adaptive and m.draft == spec for m in methods):
    return ()
  if not isinstance(engine.drafter, TreeDrafter):
    return ()
  out = []
  for shape in run_config.adaptive_trees(config):
    try:
      engine.drafter.check_tree(TreeSpec(shape=shape))
    except ValueError:
      continue
    out.append(shape)
  return tuple(out)


def measure_costs(config, engines, methods, cache_size: int, say, quick: bool = False) -> dict:
  """Per draft: the measured cost of proposing and verifying each gamma (target shared);
  `quick` (a one-prompt run): only the adaptive gammas, fewer repeats."""
  start = time.perf_counter()
  drafts = {}
  for spec, engine in engines.items():
    if spec:
      wanted = set(config.adaptive_gammas) or {1}  # (trees only: gamma 1 for c)
      used = wanted | {m.gamma for m in methods if m.draft == spec and m.gamma}
      wanted = used | (set() if quick else set(COST_GAMMAS))
      # Every gamma the run uses is timed, in a larger cache bucket if the first batch's is
      # too small for it; the cost model's extra gammas only where they fit.
      while max(used) + 1 >= cache_size:  # ends: validation keeps gammas below the cache
        cache_size = min(cache_size * 2, config.cache_size)
      gammas = tuple(sorted(g for g in wanted if g + 1 < cache_size))
      trees = adaptive_trees_of(config, engine, methods, spec)
      drafts[spec] = (engine.drafter, engine.draft_params, gammas, trees)
  if not drafts:
    return {}
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  base = engines['']
  step, costs = costs_lib.measure_drafts(
    base.params, base.cfg, drafts, config.batch_size, cache_size, sampling,
    3 if quick else 5, config.verifier,
  )  # fmt: skip
  verify = {g: v for c in costs.values() for g, v in c.verify_ms.items()}
  plain = next(iter(costs.values())).overhead_ms.get(0, 0.0)
  say(
    f'costs measured in {time.perf_counter() - start:.0f} s (batch {config.batch_size}, '
    f"{cache_size} slots): target step {step:.2f} ms (+ {plain:.2f} ms of the loop's own "
    'work a plain iteration); verify/step '
    + ', '.join(f'{g}: {verify[g] / step:.2f}' for g in sorted(verify))
  )
  for spec, c in costs.items():
    units = ', '.join(f'{g}: {c.draft_ms[g] / step:.2f}' for g in sorted(c.draft_ms))
    units += ''.join(
      f'; tree {t}: draft/step {d / step:.2f}, verify/step {v / step:.2f}'
      for t, (d, v) in c.tree_ms.items()
    )
    loop = max(c.overhead_ms.items(), default=(0, 0.0))[1]  # at its largest gamma
    steps = ', '.join(f'{k} {ms:.2f}' for k, ms in c.level_ms.items())
    steps = f'; upper-model steps (ms): {steps} (k = {c.level_k})' if steps else ''
    say(f'  {spec}: c = {c.c:.3f}; draft/step {units}; loop {loop:.2f} ms an iteration{steps}')
  return costs


def tune_kernels(config, engines, methods, trees_of, cache_size: int, say, quick: bool) -> None:
  """Chooses the CPU kernel path of every forward the run decodes with by timing whole
  forwards (bench/costs.tune_forwards; reading back what this machine recorded before;
  nothing where there is no choice): the target's step and every verification the
  methods, adaptive control and the cost model run, and each model draft's one- and
  two-row steps. Runs before anything is compiled for decoding, resumed runs included, so
  the decoding loops and the measured costs use the choices."""
  start = time.perf_counter()
  drafted = sorted({m.draft for m in methods if m.draft})
  gammas = {m.gamma for m in methods if m.gamma}
  if any(m.is_adaptive for m in methods):
    gammas |= set(config.adaptive_gammas)
  if drafted and config.measure_costs and not quick:
    gammas |= set(COST_GAMMAS)
  rows = {1} | {g + 1 for g in gammas}
  for m in methods:
    rows |= {m.tree_spec.nodes + 1} if m.tree_spec is not None else set()
    rows |= {t.size + 1 for t in trees_of.get(m.name, ())}
  rows = {r for r in rows if r < cache_size}
  batch, repeats, base = config.batch_size, 3 if quick else 5, engines['']
  found = {
    'target': costs_lib.tune_forwards(base.params, base.cfg, batch, rows, cache_size, repeats)
  }
  for spec in drafted:
    drafter, params, rows = engines[spec].drafter, engines[spec].draft_params, (1, 2)
    if isinstance(drafter, MultiLevelDrafter):  # the upper model's steps and rounds
      drafter, params, rows = drafter.upper, params['upper'], (1, 2, drafter.k + 1)
    if isinstance(drafter, ModelDrafter) and params is not None:
      found[spec] = costs_lib.tune_forwards(
        params, drafter.cfg, batch, rows, cache_size, repeats, drafter.forward, 'draft'
      )
  found = {name: rows for name, rows in found.items() if rows}
  if found:
    say(
      f'kernel paths by forward ({time.perf_counter() - start:.0f} s): '
      + '; '.join(
        f'{name} ' + ', '.join(f'{rows} rows {r["use"]}' for rows, r in by_rows.items())
        for name, by_rows in found.items()
      )
    )


def catch_up_cost(spec: str, costs) -> float:
  """What adaptive control charges per skipped token a draft feeds when it drafts again
  (plain iterations, Costs.units' unit): a draft with state of its own to catch up on (its
  kind has a `resync`: draft models, feature heads) is charged a draft step per token, c,
  what feeding them one at a time costs (a chunk is usually cheaper per token); prompt
  lookup nothing."""
  if registry.parse_draft(spec)[0].resync is None:
    return 0.0
  return round(costs.c * costs.target_ms / costs.plain_ms, 4)


def skip_hopeless(config, engines, methods, costs, say) -> list:
  """Drops the fixed-gamma methods of drafts whose measured costs cannot pay at any gamma
  (even if every draft token were accepted; a draft token costing a target step or more
  never pays), saying so in one line per draft; config.methods keeps what it names. The
  draft's adaptive method stays; the line says it stays off when its controller (the run's
  adaptive gammas, catch-up charged) cannot pay."""
  out = list(methods)
  for spec, c in costs.items():
    trees = adaptive_trees_of(config, engines[spec], methods, spec)
    best = AdaptiveConfig.from_costs(c, trees=trees).ceiling  # fixed settings: no catch-up
    if best > 1 and c.c < 1:
      continue
    fixed = [m for m in methods if m.draft == spec and m.gamma]
    line = (
      f'{spec} cannot pay on this machine: c = {c.c:.2f} target steps per draft token, at '
      f'best {best:.2f}x autoregressive even if every draft token were accepted'
    )
    if fixed and config.methods:
      line += f'; running {", ".join(m.name for m in fixed)} as config.methods names them'
    elif fixed:
      line += f'; skipping {", ".join(m.name for m in fixed)}'
      out = [m for m in out if m not in fixed]
    if (
      any(m.draft == spec and m.is_adaptive for m in methods)
      and not AdaptiveConfig.from_costs(
        c, config.adaptive_gammas, trees, catch_up_cost=catch_up_cost(spec, c)
      ).can_pay
    ):
      line += f' ({spec}@adaptive stays off)'
    say(line)
  return out


def load_workload(config) -> list[prompts_lib.Prompt]:
  if config.prompt:
    return [prompts_lib.Prompt(id='prompt', text=config.prompt, category='prompt')]
  return prompts_lib.load_prompts(config.prompts, config.num_prompts)


def decode_all(
  config,
  engines,
  methods,
  workload,
  encoded,
  tokenizer,
  say,
  keep=lambda recs: None,
  done=(),
):
  """Every method on every batch, interleaved batch by batch: (records, compile seconds,
  inputs), `inputs` the prompt ids of each record ({method: [ids]}, aligned with records).

  A multi-turn prompt (Spec-Bench's MT-bench questions, `Prompt.later_turns`) asks its next
  turn once every method has answered the one before, each method following its own answer
  (the chat so far: user, assistant, user), as Spec-Bench runs a method; rows of a batch
  without that turn sit it out. Every method's records come in the same order (a batch's
  first turns, then its second turns) and carry their turn (1, 2, ...). `keep` receives
  each (batch, turn)'s records once every method has run it (written to disk as they come);
  `done` holds such records of an interrupted run, whose (batch, turn)s are not run again.
  """
  finished = {}  # (batch, method) -> that (batch, turn)'s records, from `done`
  for r in done:
    finished.setdefault((r['batch'], r['method']), []).append(r)
  records = {m.name: [] for m in methods}
  inputs = {m.name: [] for m in methods}
  compile_seconds = {m.name: 0.0 for m in methods}
  calls = 0  # one per (batch, turn): the records' 'batch', whose decode time they share
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  for i in range(0, len(workload), config.batch_size):
    batch = list(range(i, min(i + config.batch_size, len(workload))))
    chats = {m.name: {j: [] for j in batch} for m in methods}  # each method's conversations
    for turn, rows in turns_of(workload, batch):
      # A (batch, turn) every method finished before the run was interrupted is replayed.
      replayed = all(len(finished.get((calls, m.name), ())) == len(rows) for m in methods)
      for m in methods:
        chat = chats[m.name]
        if replayed:
          recs, ids, seconds = finished[calls, m.name], None, 0.0
          for j, rec in zip(rows, recs):
            chat[j].append({'role': 'user', 'content': rec['prompt']})
        else:
          asked, ids = _turn_inputs(workload, encoded, tokenizer, chat, rows, turn)
          out = engines[m.draft].generate(
            ids,
            m,
            max_new_tokens=config.max_new_tokens,
            sampling=sampling,
            seed=config.seed + i + (turn - 1) * len(workload),
          )
          seconds = out.compile_seconds
          recs = [
            metrics.record(asked[r], ids[r], out, r, tokenizer, m.name, calls) | {'turn': turn}
            for r in range(len(rows))
          ]
        compile_seconds[m.name] += seconds
        for r, (j, rec) in enumerate(zip(rows, recs)):
          records[m.name].append(rec)
          if ids is not None:
            inputs[m.name].append(ids[r])
          else:  # replayed: the ids it was asked with, from the chat so far
            inputs[m.name].append(
              encoded[j] if turn == 1 else tokenizer.encode_conversation(chat[j])
            )
          chat[j].append({'role': 'assistant', 'content': rec['output'].strip()})
      calls += 1
      if replayed:
        continue
      keep([records[m.name][-1 - k] for m in methods for k in reversed(range(len(rows)))])
      speeds = (
        f'{m.name}: {records[m.name][-1]["decode_tokens_per_second"]:.1f} tok/s' for m in methods
      )
      label = f', turn {turn}' if turn > 1 else ''
      say(f'[{len(batch) + i}/{len(workload)}{label}] ' + ', '.join(speeds))
  return records, compile_seconds, inputs


def _turn_inputs(workload, encoded, tokenizer, chats, rows, turn):
  """(the prompts asked, their token ids) of one method's turn `turn` for `rows`, each
  row's user message appended to its chat (`chats`: row -> messages so far)."""
  asked, ids = [], []
  for j in rows:
    p = workload[j]
    text = p.text if turn == 1 else p.later_turns[turn - 2]
    chats[j].append({'role': 'user', 'content': text})
    asked.append(p if turn == 1 else dataclasses.replace(p, text=text))
    if turn == 1:
      ids.append(encoded[j])
      continue
    try:
      ids.append(tokenizer.encode_conversation(chats[j]))
    except ValueError as e:
      raise ValueError(f'prompt {p.id!r}, turn {turn}: {e}') from None
  return asked, ids


PLAN = 'plan.json'  # the costs a run measured and the methods it decodes
CONTROLS = 'controls.npz'  # adaptive controllers' states after the last finished batch


def load_plan(out_dir: pathlib.Path) -> dict | None:
  path = out_dir / PLAN
  return json.loads(path.read_text()) if path.exists() else None


@dataclasses.dataclass
class ControlStates:
  """Saves and restores the adaptive controllers' states with the finished records, so a
  resumed run's controllers go on from where the interrupted run's were."""

  engines: dict
  methods: dict  # adaptive method name -> its Method (with its AdaptiveConfig)
  sampling: SamplingConfig

  def save(self, out_dir: pathlib.Path) -> None:
    arrays = {}
    for name, m in self.methods.items():
      state = self.engines[m.draft].control_state(m, self.sampling)
      for i, leaf in enumerate(jax.tree.leaves(state) if state is not None else ()):
        arrays[f'{name}/{i:03d}'] = np.asarray(leaf)
    if arrays:
      tmp = out_dir / (CONTROLS + '.tmp.npz')
      np.savez(tmp, **arrays)
      os.replace(tmp, out_dir / CONTROLS)

  def restore(self, out_dir: pathlib.Path) -> None:
    path = out_dir / CONTROLS
    if not path.exists():
      return
    with np.load(path) as saved:
      for name, m in self.methods.items():
        keys = sorted(k for k in saved.files if k.rpartition('/')[0] == name)
        if keys:
          self.engines[m.draft].restore_control(m, self.sampling, [saved[k] for k in keys])


def resumed_records(out_dir: pathlib.Path, config, say) -> list[dict]:
  """The finished records of the interrupted run in out_dir, after checking that it ran
  this config (config.json, written when it started); a cut last line is dropped."""
  saved = out_dir / 'config.json'
  if saved.exists():
    before = json.loads(saved.read_text())
    now = json.loads(config.to_json_best_effort())
    before.pop('resume', None), now.pop('resume', None)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
      raise ValueError(
        f'config.resume=True: {out_dir} ran another config (changed: {", ".join(changed)})'
      )
  done = []
  for line in (out_dir / report.PARTIAL).read_text().splitlines():
    try:
      done.append(json.loads(line))
    except ValueError:  # cut while the last (batch, turn) was written: it runs again
      done = [r for r in done if r['batch'] != done[-1]['batch']] if done else []
      break
  if done:  # a write cut at a line's end leaves the last (batch, turn) incomplete
    last = [r for r in done if r['batch'] == done[-1]['batch']]
    first = [r for r in done if r['batch'] == done[0]['batch']]
    per_method = lambda recs: {
      m: sum(r['method'] == m for r in recs) for m in {r['method'] for r in recs}
    }
    counts = per_method(last)
    if set(counts) != set(per_method(first)) or len(set(counts.values())) != 1:
      done = [r for r in done if r['batch'] != done[-1]['batch']]
  lines = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in done)
  report.write_atomic(out_dir / report.PARTIAL, lines)  # without a cut line
  say(f'resuming: {len(done)} finished records in {out_dir / report.PARTIAL}')
  return done


def untrusted_drafts(records, say) -> str:
  """Says which methods' drafts handed the verifier untrusted probabilities (NaN,
  negative, overflowing, or 0 at their own proposal) and how often; returns them ('' if
  none)."""
  names = []
  for name, recs in records.items():
    count = sum(r.get('untrusted', 0) for r in recs)
    if count:
      names.append(name)
      iterations = sum(len(r['accepted']) for r in recs)
      say(
        f'warning: {name}: the draft handed the verifier broken probabilities (NaN, '
        f'negative, overflowing, or 0 at its own proposal) in {count} of {iterations} iterations; '
        'those positions were rejected and drawn from the target, so the output is still '
        "the target's, but the draft is broken (a diverged head or a wrong vocabulary map?)"
      )
  return ', '.join(names)


def turns_of(workload, batch: list[int]):
  """(turn, the batch's rows that ask it) for turns 1, 2, ...: a row sits out the turns
  past its prompt's last."""
  for turn in range(1, 2 + max(len(workload[j].later_turns) for j in batch)):
    yield turn, [j for j in batch if len(workload[j].later_turns) >= turn - 1]


def fit_batches(config, methods, workload) -> ml_collections.ConfigDict:
  """The config this run decodes with: batch_size at most the number of prompts (cost
  measurement and the first batch would otherwise fill rows no prompt needs). A draft
  that drafts rows in groups (consensus:N) needs every batch, each turn included, to be a
  multiple of N rows: an error naming the batch, before any model loads."""
  if config.batch_size > len(workload):
    config = config.copy_and_resolve_references()
    config.batch_size = len(workload)
  for spec in dict.fromkeys(m.draft for m in methods if m.draft):
    kind, settings = registry.parse_draft(spec)
    group = kind.group(settings)
    if group == 1:
      continue
    for i in range(0, len(workload), config.batch_size):
      batch = list(range(i, min(i + config.batch_size, len(workload))))
      for turn, rows in turns_of(workload, batch):
        if len(rows) % group:
          raise ValueError(
            f'draft {spec} drafts {group} consecutive rows together, but the batch of prompts '
            f'{i + 1}-{i + len(batch)} has {len(rows)} rows at turn {turn}: pass a '
            f'config.batch_size and config.num_prompts that are multiples of {group} '
            '(single-turn prompts)'
          )
  return config


def check_cache_fits(config, workload, encoded, tokenizer, spare: int = 0) -> None:
  """Every prompt, and every later turn after answers of max_new_tokens, fits the cache
  with `spare` slots more (the largest tree's nodes): an error naming the prompt, the
  turn and the slots it needs, before any decoding."""
  new = config.max_new_tokens + spare
  for p, ids in zip(workload, encoded):
    chat = [{'role': 'user', 'content': p.text}]
    need, worst = len(ids) + new, 1
    for turn, text in enumerate(p.later_turns, start=2):
      # Each answer before is at most max_new_tokens ('x' stands in for it: one token).
      chat += [{'role': 'assistant', 'content': 'x'}, {'role': 'user', 'content': text}]
      bound = len(tokenizer.encode_conversation(chat)) - (turn - 1) + turn * new
      if bound > need:
        need, worst = bound, turn
    if need > config.cache_size:
      size = 1 << (need - 1).bit_length()
      raise ValueError(
        f'prompt {p.id!r} ({p.category}), turn {worst}: needs up to {need} cache slots (prompt and '
        f'answers of max_new_tokens={new}), but config.cache_size = {config.cache_size}: '
        f'pass --config.cache_size={size} or fewer max_new_tokens'
      )


# The run as a pipeline: a plan read from the config once -> a session (model, encoded
# prompts, engines) -> decisions (costs, controllers, the methods that run) -> the decoded
# run (records, summary) -> the reporters the plan chose.


@dataclasses.dataclass
class Plan:
  """What a run does, read from the config once (`make_plan` is the ConfigDict's reader:
  every check runs there, before anything is loaded)."""

  config: ml_collections.ConfigDict  # the user's, batch size fitted to the workload
  user_config: ml_collections.ConfigDict  # as given (written to config.json)
  methods: list  # specjax.decode.method.Method, validated
  workload: list  # prompts_lib.Prompt
  out_dir: pathlib.Path | None  # None outside process 0
  done: list  # the finished records of an interrupted run (config.resume)
  lead: bool  # process 0: prints and writes
  verbose: bool
  say: Callable
  brief: bool = False  # the short cost measurement of a one-prompt run (the Python API's)

  @property
  def resume(self) -> bool:
    return bool(self.config.get('resume', False))

  @property
  def quick(self) -> bool:
    """One question: a short verdict in place of the table."""
    return run_config.is_quick(self.config)

  @property
  def short_costs(self) -> bool:
    """Time only what adaptive control needs, with fewer repeats (a one-prompt run)."""
    return self.quick or self.brief

  @property
  def reporters(self) -> tuple[Callable, ...]:
    """What the run shows and writes once decoding is done, in order."""
    out = [write_results, check_strict]
    if specbench.is_specbench(self.config.prompts) and not self.config.prompt:
      out.append(show_leaderboard)
    if not self.quick and (self.config.prompt or (self.verbose and len(self.workload) <= 4)):
      out.append(show_texts)
    out += [show_verdict] if self.quick else [show_table, check_dry_run]
    return tuple(out)


def make_plan(
  config: ml_collections.ConfigDict,
  workdir: str | None,
  verbose: bool,
  workload: list[prompts_lib.Prompt] | None = None,
  brief: bool = False,
) -> Plan:
  """`workload`: the prompts to run, in place of the config's; `brief`: measure costs as a
  one-prompt run does (both for the Python API)."""
  lead = jax.process_index() == 0  # with several processes, process 0 prints and writes
  say = print if verbose and lead else (lambda *a, **k: None)
  pairs.check_paths(config)  # a paper pair's config without its directories: what to pass
  methods = run_config.validate(config)
  pair_check.check_pair(config, say)  # vocabularies and bytes per device, from the headers
  pairs.report_shapes(config, say)  # dry runs: the real models' bytes per device on the mesh
  resume = bool(config.get('resume', False))
  if resume and jax.process_count() > 1:
    raise ValueError('config.resume=True runs in one process only (this run has several)')
  workload = load_workload(config) if workload is None else workload
  fitted = fit_batches(config, methods, workload)  # the user's config goes to config.json
  out_dir = make_workdir(workdir, resume) if lead else None
  done = resumed_records(out_dir, config, say) if lead and resume else []
  if lead and not resume:  # written first: a resumed run checks it ran the same config
    report.write_atomic(out_dir / 'config.json', config.to_json_best_effort(indent=2))
  return Plan(fitted, config, methods, workload, out_dir, done, lead, verbose, say, brief)


@dataclasses.dataclass
class Session:
  """The loaded model, the prompts' token ids and one engine per draft ('': the target's)."""

  model: loader.LoadedModel
  encoded: list  # token ids per prompt of the workload
  engines: dict[str, Engine]
  sampling: SamplingConfig
  trees_of: dict  # adaptive method name -> the static trees its draft can fill

  @property
  def target(self) -> Engine:
    return self.engines['']

  @property
  def drafts(self) -> dict[str, str]:
    """Draft spec -> the drafter's name."""
    return {spec: e.drafter.name for spec, e in self.engines.items() if spec}


def open_session(
  plan: Plan, model: loader.LoadedModel | None = None, built: dict[str, Engine] | None = None
) -> Session:
  """The model (`model`: already loaded, as config.model and config.dtype name it) and its
  engines (`built`: an earlier session's, reused where they fit)."""
  config, say, methods = plan.config, plan.say, plan.methods
  if model is None:
    start = time.perf_counter()
    model = loader.load_model(config.model, config.dtype)
    say(
      f'model {model.source}: {model.cfg.num_params / 1e6:.1f} M parameters, '
      f'{model.cfg.n_layers} layers, loaded in {time.perf_counter() - start:.1f} s'
    )
  encoded = []  # the prompts against the context, before any draft loads
  for p in plan.workload:
    try:
      encoded.append(model.tokenizer.encode_chat(p.text))
    except ValueError as e:
      raise ValueError(f'prompt {p.id!r}: {e}') from None
  spare = max((m.spare for m in methods), default=0)
  if any(m.is_adaptive for m in methods):
    spare = max([spare] + [s.size for s in run_config.adaptive_trees(config)])
  check_cache_fits(config, plan.workload, encoded, model.tokenizer, spare)
  engines = build_engines(config, model, methods, built)
  if engines[''].mesh is not None:
    say(describe_mesh(engines))
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  for m in methods:  # a drafter that cannot draft a tree says so before any decoding
    if m.tree_spec is not None:
      try:
        engines[m.draft].check(m, sampling)
      except ValueError as e:
        raise ValueError(f'method {m.name}: {e}') from None
  trees_of = {}
  for m in (m for m in methods if m.is_adaptive):
    trees_of[m.name] = adaptive_trees_of(config, engines[m.draft], methods, m.draft)
    if len(trees_of[m.name]) < len(run_config.adaptive_trees(config)):
      say(f'{m.name}: this draft cannot fill static trees; it chooses among chains')
      if not config.adaptive_gammas:
        raise ValueError(
          f'method {m.name}: the draft cannot fill static trees and config.adaptive_gammas '
          'is empty: nothing to choose from'
        )
  session = Session(model, encoded, engines, sampling, trees_of)
  for spec, name in session.drafts.items():
    untrained = '  (an untrained stand-in: expect low acceptance)' if 'untrained' in name else ''
    say(f'draft {spec}: {name}{untrained}')
  return session


@dataclasses.dataclass
class Decisions:
  """The measured costs, each adaptive method's controller settings, the methods that run
  (hopeless drafts' fixed settings skipped) and the controllers' saved states."""

  costs: dict[str, Costs]
  adaptive: dict[str, AdaptiveConfig]
  methods: list
  controls: ControlStates


def decide(plan: Plan, session: Session, known: dict[str, Costs] | None = None) -> Decisions:
  """Measures the costs (or reads them back when resuming) and decides what runs. `known`:
  costs measured before for these drafts (the Python API's earlier calls), used instead of
  measuring again, so adaptive controllers, static in the compiled loop, stay the same."""
  config, say, engines, methods = plan.config, plan.say, session.engines, plan.methods
  *_, cache_size = session.target.prepare(
    session.encoded[: config.batch_size], config.max_new_tokens
  )
  # Adaptive control needs its drafts' costs even where the run measures none.
  timed = {m.draft for m in methods if m.is_adaptive}
  if config.measure_costs and not plan.short_costs:
    timed |= {m.draft for m in methods}
  timed = {spec: e for spec, e in engines.items() if not spec or spec in timed}
  known = {spec: c for spec, c in (known or {}).items() if spec in timed}
  if len(known) < len(timed) - 1:  # (known costs: the kernels were chosen with them)
    tune_kernels(config, engines, methods, session.trees_of, cache_size, say, plan.short_costs)
  saved = load_plan(plan.out_dir) if plan.lead and plan.resume else None
  costs = {}
  if saved is not None:  # the interrupted run's measurements: the same decisions again
    costs = {spec: Costs.from_json(c) for spec, c in saved['costs'].items()}
    say(f'resuming with the costs measured when the run started ({plan.out_dir / PLAN})')
  elif len(timed) > 1 and len(known) == len(timed) - 1:
    costs = known
  elif len(timed) > 1:
    costs = measure_costs(config, timed, methods, cache_size, say, plan.short_costs)
  adaptive = {
    m.name: AdaptiveConfig.from_costs(
      costs[m.draft],
      config.adaptive_gammas,
      trees=() if m.schedule else session.trees_of[m.name],
      catch_up_cost=catch_up_cost(m.draft, costs[m.draft]),
      schedule=m.schedule or 'controller',
    )
    for m in methods
    if m.is_adaptive
  }
  methods = [m.with_plan(Adaptive(adaptive[m.name])) if m.is_adaptive else m for m in methods]
  if saved is None:
    methods = skip_hopeless(config, engines, methods, costs, say)
  else:
    methods = [m for m in methods if m.name in saved['methods']]
  controls = ControlStates(engines, {m.name: m for m in methods if m.is_adaptive}, session.sampling)
  if saved is not None:
    controls.restore(plan.out_dir)
  elif plan.lead:
    report.write_atomic(
      plan.out_dir / PLAN,
      json.dumps(
        {'methods': [m.name for m in methods], 'costs': {s: c.to_json() for s, c in costs.items()}},
        indent=1,
      ),
    )
  return Decisions(costs, adaptive, methods, controls)


@dataclasses.dataclass
class Run:
  """A decoded run: every method's records ({method: [record]}) and their summary
  (results.json's content)."""

  records: dict
  summary: dict
  methods: list
  broken: str  # drafts whose probabilities were untrusted ('' if none)


def decode_run(plan: Plan, session: Session, decisions: Decisions) -> Run:
  """Decodes every method (records kept on disk batch by batch) and summarises them."""
  config, out_dir, methods = plan.config, plan.out_dir, decisions.methods

  def keep(recs):
    if plan.lead:
      report.append_records(out_dir, recs)
      decisions.controls.save(out_dir)

  try:
    records, compile_seconds, inputs = decode_all(
      config,
      session.engines,
      methods,
      plan.workload,
      session.encoded,
      session.model.tokenizer,
      plan.say,
      keep,
      plan.done,
    )
  except BaseException as e:  # Ctrl-C, SIGTERM (as KeyboardInterrupt, see run.py), any error
    if plan.lead and (out_dir / report.PARTIAL).exists():
      plan.say(f'stopped: the prompts every method finished are in {out_dir / report.PARTIAL}')
    if isinstance(e, NonFiniteLogits):
      raise ValueError(f'model {config.model} in {config.dtype}: {e}') from None
    raise
  broken = untrusted_drafts(records, plan.say)
  plans = {m.name: m for m in methods}
  summaries, categories = metrics.summarize(records, compile_seconds, plans, decisions.costs)
  if config.temperature == 0 and 'autoregressive' in records:
    count_near_ties(session.target, summaries, records, inputs)
  summary = report.results(
    config,
    session.model.source,
    session.drafts,
    summaries,
    categories,
    decisions.costs,
    len(plan.workload),
    records,
  )
  return Run(records, summary, methods, broken)


def count_near_ties(target: Engine, summaries, records, inputs) -> None:
  """Sets each method's near_ties: greedy mismatches with autoregressive decoding where the
  target's top two logits were (nearly) tied, a float effect rather than a bug."""
  base, base_ids = records['autoregressive'], inputs['autoregressive']
  for name, m in summaries.items():
    # A later turn after a different answer (a greedy mismatch of an earlier turn) has
    # another prompt: its mismatch is that one's, counted as a near-tie if that was one.
    same = [k for k, ids in enumerate(inputs[name]) if list(ids) == list(base_ids[k])]
    after = [k for k in range(len(base)) if list(inputs[name][k]) != list(base_ids[k])]
    m.near_ties = sum(records[name][k]['tokens'] != base[k]['tokens'] for k in after)
    m.near_ties += metrics.count_near_ties(
      target,
      [base_ids[k] for k in same],
      [records[name][k] for k in same],
      [base[k] for k in same],
    )


# Reporters: what a finished run writes and shows (Plan.reporters picks them).


def write_results(plan: Plan, run: Run) -> None:
  if plan.lead:
    report.write_results(plan.out_dir, plan.user_config, run.records, run.summary)
    (plan.out_dir / CONTROLS).unlink(missing_ok=True)  # the run is whole: nothing to resume


def check_strict(plan: Plan, run: Run) -> None:
  if run.broken and plan.config.get('strict', False):
    raise ValueError(
      f'{run.broken}: its probabilities are broken (config.strict=True; results in {plan.out_dir})'
    )


def show_leaderboard(plan: Plan, run: Run) -> None:
  board = leaderboard.markdown(run.records, run.summary, plan.config)
  if plan.lead:
    leaderboard.write(plan.out_dir, run.records, run.summary, plan.config)
  plan.say(board)


def show_texts(plan: Plan, run: Run) -> None:
  report.show_texts(plan.say, run.records, greedy=plan.config.temperature == 0)


def show_verdict(plan: Plan, run: Run) -> None:
  for line in verdict.lines(run.summary, run.records, run.methods[1].name):
    plan.say(line)
  plan.say(f'results in {plan.out_dir}')


def show_table(plan: Plan, run: Run) -> None:
  plan.say(report.format_table(run.summary))
  plan.say(report.format_best_gamma(run.summary))
  if levels := report.format_levels(run.summary):
    plan.say(levels)
  plan.say(f'results in {plan.out_dir}  (advice: python -m specjax.advise {plan.out_dir})')


def check_dry_run(plan: Plan, run: Run) -> None:
  pairs.check_dry_run(plan.config, run.summary, plan.say)  # speculative greedy == target's


def main(
  config: ml_collections.ConfigDict, workdir: str | None = None, verbose: bool = True
) -> dict:
  """Loads the model, runs every method on the workload, writes results; returns them.

  Methods run interleaved batch by batch (every method on a batch before the next
  batch), so drift of a shared machine hits them alike. Each method's first batch of a
  shape is preceded by an explicit warm-up that compiles; that time is reported as
  compile_seconds and kept out of every timing. Returns results.json's content.
  """
  plan = make_plan(config, workdir, verbose)
  session = open_session(plan)
  decisions = decide(plan, session)
  run = decode_run(plan, session, decisions)
  for reporter in plan.reporters:
    reporter(plan, run)
  return run.summary
