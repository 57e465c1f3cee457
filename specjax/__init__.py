"""specjax: speculative decoding research framework in JAX.

  import specjax
  lm = specjax.load()  # SmolLM2-135M-Instruct, or a .gguf file, a Hugging Face directory
  print(lm.generate('What is the capital of France?', draft='quantized', compare=True))

`load` and the classes it returns live in specjax/harness/api.py; importing specjax
imports nothing heavy until they are used.
"""

__version__ = '0.1.0'
__all__ = ['load', 'LM', 'Generation']


def __getattr__(name: str):
  if name in __all__:
    from specjax.harness import api

    return getattr(api, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
