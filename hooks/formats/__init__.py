"""The files hook types write or read that have a format of their own: activation-store shards
(``store_files``) and SAELens folders (``sae_format``). Change a format here and its readers follow
from ``common/`` (``common/store_format.py`` declares the store's layout). Imports nothing of hooks/.
"""
