"""Attribution patching (``hooks=attribution``) against the same computation written in plain PyTorch."""
from __future__ import annotations

import pytest
import torch

import runner.analysis as analysis
from common.errors import ConfigError
from conftest import make_config
from runner.engine.plan import compile_plan
from runner.sources.models import build_model, gpt2_tiny
from test_interventions import GPT, RESNET, randn_batch, tokens


def hand_attribution(model: torch.nn.Module, layers: list[str], clean: torch.Tensor, corrupted: torch.Tensor,
                     metric) -> dict[str, torch.Tensor]:
    """Per layer, ``(clean - corrupted) output * d metric / d output`` summed over every dim but 1: the
    clean outputs from one pass, the corrupted ones and their gradients (tensor hooks on the outputs
    as produced) from a second pass and ``metric.backward()``."""
    modules = dict(model.named_modules())
    outputs: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args, out):
            outputs[name] = out.detach().clone()
            if out.requires_grad:
                out.register_hook(lambda grad: grads.__setitem__(name, grad))
        return hook

    handles = [modules[name].register_forward_hook(keep(name)) for name in layers]
    with torch.no_grad():
        model(clean)
    kept_clean = dict(outputs)
    metric(model(corrupted)).backward()
    for handle in handles:
        handle.remove()
    return {name: ((kept_clean[name] - outputs[name]) * grads[name]).sum(
        dim=[d for d in range(grads[name].dim()) if d != 1]) for name in layers}


def stored_estimates(run_dir) -> dict[str, torch.Tensor]:
    rows = analysis.load_tensors(run_dir, filters=[("kind", "=", "attribution")])
    assert set(rows.step) == {0} and set(rows.phase) == {"forward"}
    return {row.layer: torch.from_numpy(row.tensor).float() for row in rows.itertuples()}


def test_attribution_on_gpt2_tiny_is_the_hand_written_gradient_times_difference(run_with):
    out = run_with(*GPT, "data.seed=1", "hooks=attribution", r"hooks.attribution.layers=re:transformer\.h\.\d+")
    torch.manual_seed(0)
    model = gpt2_tiny().eval()
    by_hand = hand_attribution(model, ["transformer.h.0", "transformer.h.1"], tokens(0), tokens(1),
                               lambda output: (output.logits[:, -1, 3] - output.logits[:, -1, 4]).mean())
    got = stored_estimates(out)
    assert set(got) == set(by_hand) and all(got[name].shape == (16,) for name in got)
    for name, value in by_hand.items():
        torch.testing.assert_close(got[name], value)
    assert by_hand["transformer.h.0"].abs().max() > 1e-4  # a real signal, not zeros on both sides
    step = analysis.load_steps(out).iloc[0]  # the clean and corrupted metrics beside the step
    assert step.corrupted_logit_diff == step.logit_diff != step.clean_logit_diff


def test_attribution_on_resnet18_channels_is_the_hand_written_gradient_times_difference(run_with):
    """Channels (dim 1) of conv outputs, in train mode (batch statistics), including ``bn1`` whose output
    the next ``ReLU(inplace=True)`` overwrites: the gradient is that of the value the module produced."""
    layers = ["bn1", "layer1", "layer3"]
    out = run_with(*RESNET, "metric.target=7", "data.seed=1", "hooks=attribution",
                   f"hooks.attribution.layers=[{','.join(layers)}]", "hooks.attribution.metric=logit")
    torch.manual_seed(0)
    model = build_model(make_config(*RESNET).model).train()
    by_hand = hand_attribution(model, layers, randn_batch([2, 3, 32, 32], 0), randn_batch([2, 3, 32, 32], 1),
                               lambda logits: logits[:, 7].mean())
    got = stored_estimates(out)
    assert set(got) == set(layers)
    for name in layers:
        assert got[name].shape == (model.get_submodule(name).num_features if name == "bn1" else
                                   by_hand[name].shape[0],)
        # float32 sums over batch and positions in another order than the hand-written one: a few ulps of
        # the largest channel's value (2e-5 of 6 on one machine's BLAS), not of each channel's own
        torch.testing.assert_close(got[name], by_hand[name], rtol=1e-5, atol=1e-5 * by_hand[name].abs().max().item())
    assert all(by_hand[name].abs().max() > 0 for name in layers)


@pytest.mark.parametrize("overrides, message", [
    (("hooks.attribution.index=3",), r"^hooks.attribution.index: attribution estimates every index of dim 1 at "
                                     r"once; drop index$"),
    (("hooks.attribution.metric=logit",), r"^hooks.attribution.metric: logit needs metric.target=C "),
    (("hooks.attribution.metric=logits",), r"^hooks.attribution.metric: unknown metric 'logits'; valid: logit, "
                                          r"logit_diff; did you mean 'logit'\?$"),
    (("hooks.attribution.clean=3",), r"^hooks.attribution.clean: 3 must be a mapping of data keys"),
    (("eval_every=1",), r"^hooks.attribution: 'attribution' estimates patching each training step's batch"),
])
def test_a_bad_attribution_entry_is_one_line_before_the_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compile_plan(make_config(*GPT, "hooks=attribution", "hooks.attribution.layers=transformer.h.0", *overrides))


# -- one table: attribution rows beside real patching ---------------------------------------------
def test_attribution_rows_join_real_patching_and_path_rows_in_one_table(run_with, tmp_path):
    """Three cells of two blocks x positions 14 and 15 patched for real (own clean pass), one path job, one attribution
    run: one table with a row per method, layer and index; an attribution row's ``patched`` is the
    corrupted metric plus the stored estimate."""
    from runner.analysis.patching import attribution_against_patching, patching_table

    for layer, position in ((0, 14), (0, 15), (1, 15)):
        run_with(*GPT, "data.seed=1", "hooks=patch", "hooks.patch.source=clean",
                 f"hooks.patch.layers=transformer.h.{layer}", f"hooks.patch.index={position}")
    run_with(*GPT, "data.seed=1", "hooks=patch", "hooks.patch.source=clean", "hooks.patch.layers=transformer.h.0",
             "hooks.patch.receiver=transformer.h.1", "hooks.patch.index=15")
    attributed = run_with(*GPT, "data.seed=1", "hooks=attribution", r"hooks.attribution.layers=re:transformer\.h\.\d+")
    table = patching_table(tmp_path)
    assert list(table.columns) == ["method", "layer", "receiver", "index", "scale", "patched", "clean", "corrupted",
                                   "recovered", "kl"]
    assert table.groupby("method").size().to_dict() == {"attribution": 32, "patch": 3, "path": 1}
    assert list(table.method.drop_duplicates()) == ["patch", "attribution", "path"]  # common.records.METHODS order
    estimates = stored_estimates(attributed)
    step = analysis.load_steps(attributed).iloc[0]
    for row in table[table.method == "attribution"].itertuples():
        estimate = float(estimates[row.layer][row.index])
        assert row.patched == pytest.approx(step.corrupted_logit_diff + estimate, abs=1e-7)
        assert (row.clean, row.corrupted) == (step.clean_logit_diff, step.corrupted_logit_diff)
    path = table[table.method == "path"].iloc[0]
    assert (path.layer, path.receiver, path["index"]) == ("transformer.h.0", "transformer.h.1", 15)
    assert table[table.method != "path"].receiver.isna().all()
    # the next block reads the sender's output: the path recovers what the whole patch does
    whole = table[(table.method == "patch") & (table.layer == "transformer.h.0") & (table["index"] == 15)].iloc[0]
    assert path.recovered == pytest.approx(whole.recovered, abs=1e-5)
    both, r = attribution_against_patching(table)
    assert len(both) == 3 and set(both.columns) == {"layer", "index", "attribution", "patch"}
    a, p = both["attribution"].to_numpy(), both["patch"].to_numpy()
    assert r == pytest.approx(float(((a - a.mean()) * (p - p.mean())).sum()
                                    / ((((a - a.mean()) ** 2).sum() * ((p - p.mean()) ** 2).sum()) ** 0.5)))
    # a list of paths is one table too, and a run stored before receivers loads as method patch
    assert patching_table([tmp_path / "run0", attributed]).groupby("method").size().to_dict() == {
        "attribution": 32, "patch": 1}


@pytest.mark.slow  # a warm-up and a round of three runs: over 20 s on 2 cores
def test_the_quick_attribution_benchmark_writes_its_table(tmp_path, monkeypatch):
    """The smoke run of ``python -m benchmarks.attribution``: both measures and the correlation land in
    its tables. Its runs are real; the seconds each returns are replaced (3 s a round for the
    attribution run, 12 s and 30 s for the sweep), so the table's numbers are known whatever the load."""
    import pandas as pd

    from benchmarks import attribution as bench

    def timed(measure, seconds):
        def replaced(s, out):
            measure(s, out)
            return seconds.pop(0)
        return replaced

    monkeypatch.setattr(bench, "attribution_run", timed(bench.attribution_run, [99.0, 3.0, 3.0]))  # warm-up first
    monkeypatch.setattr(bench, "patching_sweep", timed(bench.patching_sweep, [12.0, 30.0]))
    correlated = []
    compare = bench.attribution_against_patching
    monkeypatch.setattr(bench, "attribution_against_patching", lambda table: correlated.append(compare(table))
                        or correlated[-1])
    out = bench.main(["--quick", "--rounds", "2", "--out", str(tmp_path)])
    rows = pd.read_parquet(out / "attribution.parquet")
    assert list(rows.name) == ["sweep / attribution", "correlation"]
    assert (rows.value.iloc[0], rows.ratio.iloc[0]) == (21.0, 7.0)  # median sweep; median of 12/3, 30/3
    assert rows.value.iloc[1] == correlated[-1][1]  # the r of the last round's real sweep and attribution run
    assert "2 patching jobs against one attribution run (2 round(s)" in (out / "attribution.md").read_text()
