"""The files hook types write or read that have a format of their own: activation-store shards
(``store_files``), SAELens folders (``sae_format``, with what each SAE architecture computes:
``sae_architectures``) and transcoder folders, SAELens's and circuit-tracer's (``transcoder_format``). Change a
format here and its readers follow
from ``common/`` (``common/store_format.py`` declares the store's layout). Imports nothing of hooks/.
"""
