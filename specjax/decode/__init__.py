"""Decoding, above core, models, verify, drafters and control: loop.py (the one
lax.while_loop body for every method), prefill.py, engine.py (host side: validation,
bucketing, sharding, jit, timing)."""
