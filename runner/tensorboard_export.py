"""``python -m runner.tensorboard_export PATH``: alias of ``runner.analysis.tensorboard``."""
from runner.analysis.tensorboard import export, export_run, main  # noqa: F401

if __name__ == "__main__":
    main()
