"""Drafters: everything that proposes tokens for the target to verify, one file per kind
(model.py, ngram.py, distilled.py, consensus.py, multilevel.py), each with the `DraftKind`
the registry (specjax/registry.py DRAFTS) names. Imports core, models and checkpoints (a model draft
loads its weights); never decode, control or the entry points."""

from specjax.drafters.consensus import ConsensusDrafter
from specjax.drafters.model import ModelDrafter, truncated_target
from specjax.drafters.ngram import NgramDrafter

__all__ = ['ConsensusDrafter', 'ModelDrafter', 'NgramDrafter', 'truncated_target']
