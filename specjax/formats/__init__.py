"""File formats read below the model code: GGUF headers and tensor tables (gguf_file.py).

Modules here import only numpy and format packages; nothing else in specjax.
"""
