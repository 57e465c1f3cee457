"""The bottom layer: what every other package builds on.

sampling.py (sampling settings, warps, samplers), state.py (the typed decoding state and
`commit`), contract.py (the model-family contract and the drafter interface). Modules here
import only jax, numpy, flax, each other and specjax.kernels (sampling's argmax on a CPU
kernel); nothing else in specjax.
"""
