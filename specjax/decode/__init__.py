"""Decoding, above core, models, verify, drafters and control: method.py (a decoding method
as one frozen value), loop.py (the one lax.while_loop body for every method), prefill.py,
engine.py (host side: validation, bucketing, sharding, jit, timing)."""
