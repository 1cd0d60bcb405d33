"""The runner's Slurm launcher: Hydra finds launchers only in the ``hydra_plugins`` package."""
