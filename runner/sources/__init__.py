"""What a run is made of: models, data and losses, each by name or ``_target_``."""
