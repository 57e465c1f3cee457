"""Drafters: everything that proposes tokens for the target to verify."""

from specjax.core.contract import Drafter
from specjax.drafters.consensus import ConsensusDrafter
from specjax.drafters.model import ModelDrafter, truncated_target
from specjax.drafters.ngram import NgramDrafter

__all__ = ['ConsensusDrafter', 'Drafter', 'ModelDrafter', 'NgramDrafter', 'truncated_target']
