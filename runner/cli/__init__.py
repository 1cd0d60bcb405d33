"""The Hydra edge: the command line, Hydra callbacks, signals and exit statuses."""
