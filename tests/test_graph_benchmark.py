"""``python -m benchmarks.graph --quick``: the graph's cost per prompt beside one forward and backward, and a
command-line sweep whose merged tables are checked against its jobs' own."""
import pandas as pd
import pytest

from benchmarks import graph


@pytest.mark.slow
def test_the_quick_graph_benchmark_times_a_graph_beside_a_forward_and_backward_and_checks_its_sweep(tmp_path):
    graph.main(["--quick", "--out", str(tmp_path)])
    rows = pd.read_parquet(tmp_path / "graph.parquet").set_index("name")
    timed = rows.loc["graph per prompt / forward+backward"]
    assert timed.value > 0 and timed.ratio > 0
    assert rows.loc["sweep over 2 jobs, CPU"].value > 0
    assert "| sweep's merged tables equal its jobs' own | yes |" in (tmp_path / "graph.md").read_text()


def test_a_sweep_whose_merged_rows_differ_from_its_jobs_is_said_to_differ():
    jobs = pd.DataFrame({"sample": [0, 1], "node": [0, 0], "weight": [0.5, 0.25]})
    assert graph._same(jobs.iloc[::-1], jobs)
    assert not graph._same(jobs.assign(weight=[0.5, 0.3]), jobs)
    assert not graph._same(jobs.iloc[:1], jobs)
