"""Where a run keeps its config: read without pandas by the summary a run prints when it ends
(the format is ``common.run_config``'s, which every reader of ``config.yaml`` goes through)."""
from __future__ import annotations

from common.run_config import saved_config_path as config_path  # noqa: F401  (the analysis modules' name for it)
