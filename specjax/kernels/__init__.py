"""Hand-written kernels that XLA calls through JAX's FFI (see cpu.py)."""

from specjax.kernels.cpu import KERNEL_ROWS, applicable, rows_product, status

__all__ = ['KERNEL_ROWS', 'applicable', 'rows_product', 'status']
