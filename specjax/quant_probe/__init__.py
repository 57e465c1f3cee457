"""Speculative decoding as a quantisation fidelity probe: `python -m specjax.quant_probe
--config configs/quant_probe.py` judges each candidate GGUF file sound or broken against a
reference and names the tensor that breaks a broken one (probe.py)."""
