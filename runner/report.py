"""``python -m runner.report PATH``: alias of ``runner.analysis.report``."""
from runner.analysis.report import main, render, write_report  # noqa: F401

if __name__ == "__main__":
    main()
