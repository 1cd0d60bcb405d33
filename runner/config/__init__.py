"""The config schema: typed dataclasses registered in Hydra's ConfigStore, and what Hydra cannot check."""
