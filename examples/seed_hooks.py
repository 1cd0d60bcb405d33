"""The tutorials' hooks that no preset expresses, as the functions the tutorials write.

Each is named by import path in a config (the README gives the command line for each):

* ``print_packing`` / ``print_unpacking``: saved-tensor hooks that print what they pack and
  unpack (``hooks=offload hooks.offload.mode=custom hooks.offload.pack=... unpack=...``);
* ``times_four`` / ``quarter``: pack ``x * 4``, unpack ``x / 4`` (unpack(pack(x)) == x);
* ``store_in_list`` / ``load_from_list``: pack the index of ``x`` in a list, unpack by index;
* ``print_layer``: the forward hook printing a layer, its input and its output (with
  ``max_calls`` it is removed after N calls, the tutorial's ``handle.remove()``);
* ``add_factor_kwarg``: a forward hook that reads the keyword arguments of the call
  (``with_kwargs: true``) and returns ``output + kwargs["factor"]``.
"""
from __future__ import annotations

import torch
from torch import nn

#: What ``store_in_list`` packed, in packing order (the tutorial's ``storage``).
STORAGE: list[torch.Tensor] = []


def print_packing(x: torch.Tensor) -> torch.Tensor:
    print("packing:", x)
    return x


def print_unpacking(x: torch.Tensor) -> torch.Tensor:
    print("unpacking:", x)
    return x


def times_four(x: torch.Tensor) -> torch.Tensor:
    print("packing:", x * 4)
    return x * 4


def quarter(x: torch.Tensor) -> torch.Tensor:
    print("unpacking:", x / 4)
    return x / 4


def store_in_list(x: torch.Tensor) -> int:
    STORAGE.append(x)
    return len(STORAGE) - 1


def load_from_list(index: int) -> torch.Tensor:
    return STORAGE[index]


def print_layer(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
    print(f"layer: {module}")
    print(f"input: {inputs}")
    print(f"output: {output}")


def add_factor_kwarg(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
    return output + kwargs["factor"]
