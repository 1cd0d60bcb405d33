"""Tensors that are not ordinary strided ones, and what the recorder reads of each: the one place that decides.

Why: a hook sees whatever the model hands it, and not every tensor has a strided storage the
statistics (and the C kernel behind them) can read. Each kind is recorded as the values it stands
for, or refused in one line naming the layer and the kind:

- sparse (COO, CSR, CSC, BSR, BSC): the dense tensor it stands for, implicit zeros included, so
  ``zero_frac`` is its sparsity; reduced from its stored values without making it dense
  (``hooks.kernels.stats.reduce_tensor``), made dense only when its values are kept;
- nested (strided or jagged): the 1-D tensor of its components' elements in order
  (``tensor_shape`` is ``[elements]``); ``sample.batch`` keeps its first components;
- quantized: its dequantized values (the ``dtype`` column keeps the quantized dtype);
- a tensor subclass that overrides only ``__torch_function__``: the plain tensor over the same
  storage, so the statistics run no code of the subclass; wrapper subclasses with no storage of
  their own (``__torch_dispatch__``) are reduced through their own operators (``DTensor``:
  ``hooks.mechanism.shards``);
- meta: it holds no values; refused when statistics are asked (the meta-device rehearsal only
  counts shapes and passes).

Edits (``clip``'s clamp, a user's ``custom`` edit, ...) change a sparse tensor as the dense one it
stands for and give it back in its own layout; quantized and nested tensors are refused in one
line. Per-sample observers (``units``, ``store``) read a sparse or quantized tensor's dense values
and refuse a nested one (its components have no common shape).
"""
from __future__ import annotations

import torch

from common.errors import ConfigError

#: Layouts with stored values and implicit zeros.
SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def is_sparse(t: torch.Tensor) -> bool:
    return t.layout in SPARSE_LAYOUTS


def check_held(t: torch.Tensor) -> None:
    """Refuse, in one line, a plain strided tensor whose storage does not hold what it reads (up to its last
    element, through its strides: an expanded view reads fewer bytes than its elements): FSDP2 frees an
    unsharded parameter's storage under it between uses, and reading it would read freed memory."""
    last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    held, needed = t.untyped_storage().nbytes(), (last + 1) * t.element_size()
    if held < needed:
        raise ConfigError(f"a {list(t.shape)} tensor whose storage holds {held} of its {needed} bytes (freed "
                          f"under it, as FSDP2 frees unsharded parameters between uses) cannot be recorded; "
                          f"record the sharded parameter or its gradient")


def nested_elements(t: torch.Tensor, first: int | None = None) -> torch.Tensor:
    """The elements of a nested tensor's components (its first ``first`` components), flat and in order."""
    parts = [c.reshape(-1) for c in t.unbind()[:first]]
    return torch.cat(parts) if parts else torch.empty(0, dtype=t.dtype, device=t.device)


def sparse_select(t: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``t``'s entries at ``index`` along ``dim``, still sparse (COO: the layout every sparse kind turns into)."""
    coo = t if t.layout == torch.sparse_coo else t.to_sparse_coo()
    return coo.index_select(dim, index.to(t.device))


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """A sparse tensor's stored values, each element once (duplicates of an uncoalesced COO summed)."""
    coo = t if t.layout == torch.sparse_coo else t.to_sparse_coo()
    return coo.coalesce().values()


def plain(t: torch.Tensor) -> torch.Tensor:
    """A ``__torch_function__`` subclass as the plain tensor over its storage (decided on the type alone,
    so no code of the subclass runs); any other tensor as it is."""
    kind = type(t)
    if kind is torch.Tensor or kind is torch.nn.Parameter or kind.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return t
    return torch.Tensor.as_subclass(t, torch.Tensor)


def ordinary(t: torch.Tensor, where: str, values: bool = True) -> torch.Tensor:
    """``t`` as the recorder reads it (see the module's docstring); sparse and nested tensors stay as
    they are (``stored_values``, ``nested_elements``).

    ``where`` names the tensor in the one-line refusal (``"'fc' output 0"``); ``values=False``
    (nothing is reduced or kept) refuses nothing.
    """
    t = plain(t)
    if t.is_meta and values:
        raise ConfigError(f"{where} is a meta tensor: it holds no values to record (run the model on a device "
                          f"with data, or leave this layer out of the entry)")
    return t.dequantize() if t.is_quantized else t


def dense(t: torch.Tensor) -> torch.Tensor:
    """The strided tensor ``t`` stands for (a sparse one made dense; any other as it is)."""
    return t.to_dense() if is_sparse(t) else t


def kind_name(t: torch.Tensor) -> str:
    """The kind the one-line refusals name: ``sparse_csr``, ``quantized``, ``nested``, ``meta``, ``strided``."""
    if t.is_nested:
        return "nested"
    if t.is_quantized:
        return "quantized"
    if t.is_meta:
        return "meta"
    return str(t.layout).removeprefix("torch.")


def edited(fn, t: torch.Tensor, where: str, *args) -> torch.Tensor:
    """``fn(t, *args)`` for a tensor of any kind: a sparse ``t`` is changed as the dense tensor it stands
    for and given back in its layout; a quantized or nested one is refused in one line naming ``where``."""
    if t.is_quantized or t.is_nested:  # values can be read of these, but no edit may change them
        raise ConfigError(f"{where} is a {kind_name(t)} tensor, which no edit can change; "
                          f"leave this layer out of the entry")
    if t.layout not in SPARSE_LAYOUTS:  # the usual tensor, decided without a call (an edit runs per gradient)
        return fn(t, *args)
    blocks = tuple(t.values().shape[-2:]) if t.layout in (torch.sparse_bsr, torch.sparse_bsc) else None
    return fn(t.to_dense(), *args).to_sparse(layout=t.layout, blocksize=blocks, dense_dim=t.dense_dim())


def per_sample(t: torch.Tensor, where: str) -> torch.Tensor:
    """``t`` as a strided tensor of its own shape, for observers that read it sample by sample."""
    if t.is_nested:
        raise ConfigError(f"{where} is a nested tensor: its components have no common shape to read "
                          f"sample by sample; leave this layer out of the entry")
    return dense(ordinary(t, where, values=False))
