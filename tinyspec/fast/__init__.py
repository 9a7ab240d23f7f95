"""Fast leaves: Numba (`numba_*.py`) and CUDA (`cuda_*.py`) kernels with the same names, arguments and
contracts as the NumPy oracle functions they speed up (e.g. `numba_ops.quant_linear` is
`tinyspec.ops.quant_linear`). Oracle modules never import this package; only `tinyspec.backends`
picks a leaf, lazily, so tinyspec imports and runs without numba or cupy installed. Every leaf is
tested against its oracle (tests/test_numba_ops.py, ...).
"""
