"""The arithmetic on captured tensors: per-tensor statistics (``stats``), per-unit running statistics
(``unit_stats``), what is read of each tensor kind (``tensor_kinds``: sparse, nested, quantized, ...)
and the C kernels built on first use (``native``: ``stats_kernel.c``, ``units_kernel.c``,
``kernel_keys.h``). Exactness lives here: a change is checked against float64 eager PyTorch
(tests/test_stats.py, tests/test_kernels_equal_eager.py). Imports nothing of hooks/ outside this room.
"""
