"""Model families over core: one file per family (llama.py), each exporting `FAMILY` (the
model contract of specjax/core/contract.py) and its config class; kv_cache.py (the
static-shape cache) and sharding.py (partition rules, meshes). Imports only core."""
