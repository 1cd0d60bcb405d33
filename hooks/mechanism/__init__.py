"""The hook mechanism: how entries become registered PyTorch hooks, and how they are removed.

Selection (``select``: names, globs, ``type:``, the families' canonical names in ``families``), the
``HookType`` base and the entry registry (``base``, ``registry``), the one owner of every handle
(``session``), the forward tap and the gradient junction every module-level type shares (``tap``,
``junction``), the capture buffer (``recorder``), sharded tensors (``shards``) and hooks under
``torch.compile`` (``compiled``). Change it when every hook type needs the change; a new hook type
never touches this room (it goes in ``hooks/types/`` and ``hooks/specs/``); a new transformer family
is one table in ``families``. Imports ``hooks.kernels`` and ``hooks.specs``, never ``hooks.types``.
"""
