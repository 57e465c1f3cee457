"""specjax: speculative decoding research framework in JAX."""

__version__ = '0.1.0'
