"""Import alias kept for users: ``runner.plots`` is ``runner.analysis.plots``."""
import sys

from runner.analysis import plots

sys.modules[__name__] = plots
