"""The runner's sweeper: Hydra finds sweepers only in the ``hydra_plugins`` package."""
