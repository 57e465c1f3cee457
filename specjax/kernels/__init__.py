"""CPU kernels for XLA:CPU (see specjax/kernels/cpu.py)."""

from specjax.kernels.cpu import applicable, dense_product, rows_product, status

__all__ = ['applicable', 'dense_product', 'rows_product', 'status']
