"""A decoding method: one frozen value from the config's text to the jitted loop.

A `Method` names a draft (a registry spec, '' for none), a plan and a verifier. The plan
says what each iteration does:

  Plain()          autoregressive decoding: one target token per iteration;
  Chain(k)         draft k tokens, verify them in one target forward;
  Tree(spec)       draft a token tree (specjax.core.tree.TreeSpec), verify it in one forward;
  Adaptive(config) adaptive control picks off, a chain or a tree every iteration
                   (specjax.control.adaptive.AdaptiveConfig; a run fills `config` in from
                   the costs it measures, so a parsed '<draft>@adaptive' has none yet).

`Method.parse` reads the text a run's config uses ('autoregressive', 'ngram@4',
'eagle@adaptive', 'dspark@scheduled', 'ngram@3x2x1'); the constructors build the same
values in code. What a method's own fields say (a chain length, a verifier's name, a
tree's text) is checked when it is built; what depends on the drafter and the sampling (a
drafter that can draft trees, a greedy-only verifier, block verification of a tree: a
config may declare such methods without running them) is checked by `check` before a
batch is prepared. The engine
hands the value unchanged to the jitted loop as a static argument, and metrics read it
back.
"""

from __future__ import annotations

import dataclasses

from specjax import registry
from specjax.control.adaptive import AdaptiveConfig
from specjax.core import tree as tree_lib
from specjax.core.contract import ConfidenceDrafter, TreeDrafter


@dataclasses.dataclass(frozen=True)
class Plain:
  """Autoregressive decoding."""


@dataclasses.dataclass(frozen=True)
class Chain:
  """Draft k >= 1 tokens a row, verify them in one target forward."""

  k: int

  def __post_init__(self):
    if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
      raise ValueError(f'a chain drafts an integer >= 1 tokens, got {self.k!r}')


@dataclasses.dataclass(frozen=True)
class Tree:
  """Draft a token tree every iteration, verify it in one target forward."""

  spec: tree_lib.TreeSpec


@dataclasses.dataclass(frozen=True)
class Adaptive:
  """Adaptive control over off, chains and trees (`config`: None until a run has measured
  the costs it is built from). `schedule` 'confidence': the draft's confidence head picks
  each iteration's length ('<draft>@scheduled')."""

  config: AdaptiveConfig | None = None
  schedule: str = 'controller'

  def __post_init__(self):
    if self.config is not None and self.config.schedule != self.schedule:
      object.__setattr__(self, 'schedule', self.config.schedule)


PLAIN = Plain()


@dataclasses.dataclass(frozen=True)
class Method:
  """A decoding method (a jit static argument: frozen and hashable).

  draft: the registry spec of its draft ('' for autoregressive decoding, or where the
    engine's drafter was built in code); plan: Plain, Chain, Tree or Adaptive; verifier:
    a registry verifier name (rejection, block, greedy); label: the name it was given
    ('' to derive one, see `name`).
  """

  plan: Plain | Chain | Tree | Adaptive = PLAIN
  verifier: str = 'rejection'
  draft: str = ''
  label: str = ''

  def __post_init__(self):
    if not isinstance(self.plan, (Plain, Chain, Tree, Adaptive)):
      raise ValueError(f'a method plan is Plain, Chain, Tree or Adaptive, got {self.plan!r}')
    registry.VERIFIERS.get(self.verifier)
    if self.label:  # kept only where it differs from the derived name (equal methods hash equal)
      given = self.label
      object.__setattr__(self, 'label', '')
      if self.name != given:
        object.__setattr__(self, 'label', given)

  # Constructors.

  @classmethod
  def chain(cls, k: int, verifier: str = 'rejection', draft: str = '') -> Method:
    """k tokens drafted per iteration; k = 0 is autoregressive decoding."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
      raise ValueError(f'gamma must be an integer >= 0 (0 = autoregressive), got {k!r}')
    return cls(PLAIN if k == 0 else Chain(k), verifier, draft)

  @classmethod
  def tree(cls, spec: tree_lib.TreeSpec, verifier: str = 'rejection', draft: str = '') -> Method:
    return cls(Tree(spec), verifier, draft)

  @classmethod
  def adaptive(cls, config: AdaptiveConfig, verifier: str = 'rejection', draft: str = '') -> Method:
    return cls(Adaptive(config), verifier, draft)

  @classmethod
  def parse(cls, text: str, verifier: str = 'rejection') -> Method:
    """'autoregressive', '<draft>@<k>', '<draft>@adaptive', '<draft>@scheduled' or
    '<draft>@<tree>'; a bad text is one ValueError naming what is expected."""
    text = text.strip()
    if text == 'autoregressive':
      return cls(PLAIN, verifier, '', text)
    draft, at, setting = text.rpartition('@')
    usage = (
      f'expected "autoregressive", "<draft>@<gamma>", "<draft>@adaptive", '
      f'"<draft>@scheduled" (drafts with a confidence head) or "<draft>@<tree>" '
      f'(a tree: {tree_lib.TREE_USAGE}), with a draft one of: {", ".join(registry.DRAFTS.names)}'
    )
    if not at or not draft:
      raise ValueError(f'unknown method {text!r}: {usage}')
    if setting == 'adaptive':
      return cls(Adaptive(), verifier, draft, text)
    if setting == 'scheduled':
      if not registry.parse_draft(draft)[0].scheduled:
        raise ValueError(
          f'method {text!r}: a confidence-scheduled verification needs a draft with a '
          'confidence head (dspark:...)'
        )
      return cls(Adaptive(schedule='confidence'), verifier, draft, text)
    if setting.isdigit():
      if int(setting) < 1:
        raise ValueError(f'method {text!r}: a draft length >= 1 after the @')
      return cls(Chain(int(setting)), verifier, draft, text)
    try:
      spec = tree_lib.parse_tree(setting)
    except ValueError:
      raise ValueError(f'unknown method {text!r}: {usage}') from None
    return cls(Tree(spec), verifier, draft, text)

  def with_plan(self, plan) -> Method:
    """The same method (name, draft, verifier) with another plan: a parsed adaptive
    method with its measured AdaptiveConfig, or adaptive control's arms."""
    return dataclasses.replace(self, plan=plan)

  # What the loop and the reports read.

  @property
  def name(self) -> str:
    if self.label:
      return self.label
    plan = self.plan
    if isinstance(plan, Plain):
      return 'autoregressive'
    setting = {
      Chain: lambda: str(plan.k),
      Tree: lambda: plan.spec.describe(),
      Adaptive: lambda: 'scheduled' if plan.schedule == 'confidence' else 'adaptive',
    }[type(plan)]()
    return f'{self.draft or "draft"}@{setting}'

  @property
  def gamma(self) -> int:
    """A chain's draft length (0 for any other plan)."""
    return self.plan.k if isinstance(self.plan, Chain) else 0

  @property
  def schedule(self) -> str:
    """'confidence' for a confidence-scheduled method ('<draft>@scheduled'), else ''."""
    is_confidence = isinstance(self.plan, Adaptive) and self.plan.schedule == 'confidence'
    return 'confidence' if is_confidence else ''

  @property
  def speculative(self) -> bool:
    return not isinstance(self.plan, Plain)

  @property
  def adaptive_config(self) -> AdaptiveConfig | None:
    """Adaptive control's settings (None: not adaptive, or not yet measured)."""
    return self.plan.config if isinstance(self.plan, Adaptive) else None

  @property
  def is_adaptive(self) -> bool:
    return isinstance(self.plan, Adaptive)

  @property
  def tree_spec(self) -> tree_lib.TreeSpec | None:
    """A tree method's tree (None for any other plan)."""
    return self.plan.spec if isinstance(self.plan, Tree) else None

  @property
  def depth(self) -> int:
    """The deepest draft position an iteration may verify (0: autoregressive)."""
    plan = self.plan
    if isinstance(plan, Chain):
      return plan.k
    if isinstance(plan, Tree):
      return plan.spec.max_depth
    if isinstance(plan, Adaptive):
      if plan.config is None:
        raise ValueError(f'{self.name}: adaptive control needs its costs (an AdaptiveConfig)')
      return plan.config.depth
    return 0

  @property
  def tree_specs(self) -> tuple[tree_lib.TreeSpec, ...]:
    """The trees this method may draft (its own, or adaptive control's)."""
    if isinstance(self.plan, Tree):
      return (self.plan.spec,)
    config = self.adaptive_config
    return tuple(tree_lib.TreeSpec(shape=t) for t in (config.trees if config else ()))

  @property
  def spare(self) -> int:
    """Cache slots a row needs beyond its tokens: the largest tree's nodes (0: chains)."""
    return max((t.nodes for t in self.tree_specs), default=0)

  @property
  def arms(self) -> tuple[Method, ...]:
    """Adaptive control's settings as fixed methods, by setting index (0: plain steps
    that still keep the drafter's state in step)."""
    out = []
    for arm in self.adaptive_config.arms:
      plan = Chain(arm) if isinstance(arm, int) and arm else PLAIN
      if not isinstance(arm, int):
        plan = Tree(tree_lib.TreeSpec(shape=arm))
      out.append(Method(plan, self.verifier, self.draft))
    return tuple(out)


def check(method: Method, drafter, sampling=None) -> None:
  """What a method needs of the drafter that runs it (and of the sampling, if given): one
  ValueError naming the problem, before any batch is prepared."""
  if method.is_adaptive and method.adaptive_config is None:
    raise ValueError(f'{method.name}: adaptive control needs its costs (an AdaptiveConfig)')
  if method.verifier == 'block' and method.tree_specs:
    raise ValueError(
      'block verification is proved for chains only: verify trees with rejection or greedy'
    )
  if method.speculative and drafter is None:
    raise ValueError(
      f'gamma={method.depth} needs a drafter, and this engine has none ({method.name})'
    )
  for spec in method.tree_specs:
    if not isinstance(drafter, TreeDrafter):
      raise ValueError(f'the {drafter.name} drafter cannot propose token trees')
    drafter.check_tree(spec)
  config = method.adaptive_config
  confident = isinstance(drafter, ConfidenceDrafter)
  if config is not None and config.schedule == 'confidence' and not confident:
    raise ValueError(
      f'a confidence schedule needs a drafter with a confidence head (dspark); '
      f'{drafter.name} has none'
    )
  if sampling is not None and registry.VERIFIERS.get(method.verifier).greedy_only:
    if not sampling.greedy:
      raise ValueError(
        f'the {method.verifier} verifier is only lossless for greedy decoding, not at '
        f'temperature {sampling.temperature}: use rejection or block'
      )


AUTOREGRESSIVE = Method()
