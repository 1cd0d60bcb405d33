"""``python -m runner.graph_json RUN_DIR --sample N --out FILE``: alias of ``runner.analysis.graph_json``."""
from runner.analysis.graph_json import add_to_index, export, graph_json, main, select_prompt  # noqa: F401

if __name__ == "__main__":
    main()
