"""The hook types: one module per family of types (``gradients``: clamp, scale, replace; ``sae``; ...).

Each type's keys are its spec in ``hooks/specs/`` (torch-free, read by the command line); its module
here is imported when an entry of it is first built and registers the class that attaches it. A new
hook type is one module here and one spec there (docs/explanation/architecture.md, "Where a new thing
goes"); nothing else is touched. Types stand on ``hooks.mechanism``, ``hooks.kernels`` and
``hooks.formats``; no other room imports a type.
"""
