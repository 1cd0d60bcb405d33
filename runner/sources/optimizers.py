"""The built-in optimizers, registered with their schemas: ``none`` (measurement passes), ``sgd``, ``adam``.

An optimizer is registered as the callable ``build(params, **keys)`` its config's keys (all but
``name``) are passed to: a ``torch.optim.Optimizer`` class as it is (``None``: no optimizer).
"""
from __future__ import annotations

import torch

from runner.config.registry import OPTIMIZERS
from runner.config.schema import AdamConfig, NoOptimizer, SGDConfig

OPTIMIZERS.register("none", schema=NoOptimizer)(None)
OPTIMIZERS.register("sgd", schema=SGDConfig)(torch.optim.SGD)
OPTIMIZERS.register("adam", schema=AdamConfig)(torch.optim.Adam)
