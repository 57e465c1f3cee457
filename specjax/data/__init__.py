"""Evaluation prompt sets: prompts.py (HumanEval, MT-bench, JSONL files, code_edit) and
code_edit.py (editing prompts built from the standard library's source). Imports only the
top-level assets module."""
