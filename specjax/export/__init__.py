"""Trained drafts in the layouts vLLM, SGLang and transformers load (python -m specjax.export)."""

from specjax.export.engines import ENGINES, export, main

__all__ = ['ENGINES', 'export', 'main']
