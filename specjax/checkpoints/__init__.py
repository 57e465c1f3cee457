"""Reading and writing weights: gguf.py, hf.py (Hugging Face directories), orbax_io.py
(specjax's own trees), draft_dir.py (distilled drafts), loader.py (a model and its
tokenizer from one spec). Name tables and shape checks, no model logic; imports core,
models, and the top-level assets, testing and tokenizer modules."""
