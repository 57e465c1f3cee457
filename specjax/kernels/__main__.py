"""python -m specjax.kernels: compiles and registers the CPU kernels, and says how it went."""

import sys

from specjax.kernels import cpu

ok = cpu.load()
print(cpu.status())
sys.exit(0 if ok else 1)
