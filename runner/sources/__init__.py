"""What a run is made of: models, data, losses and optimizers, each registered by name
(``runner.config.registry``). Importing this package registers every built-in choice."""
from runner.sources import datasets, kinds, losses, models, optimizers, text  # noqa: F401  (registration side effects)
