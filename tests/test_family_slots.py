"""The residual stream's points (``blocks.i.resid_pre``, ``resid_mid``, ``resid_post``: one tensor of a module's
call, ``hooks.families``) and the ``canonical`` column of every capture table, on the families of
``tests/test_families.py`` (their folders, configs and plain-hook pass are reused). Every value is checked
against plain PyTorch hooks on each family's own modules, named here (``LN2``) apart from the vocabulary."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import runner.analysis as analysis
from conftest import make_config, run, run_main
from runner.engine.plan import compile_plan
from test_families import REAL, folders, hand_pass, overrides, parts_of, refused  # noqa: F401  (folders: a fixture)

transformers = pytest.importorskip("transformers")

#: Each family's norm before its MLP, by its own name: ``resid_mid`` is that norm's input.
LN2 = {"gpt2": "ln_2", "gemma2": "pre_feedforward_layernorm", "gemma3": "pre_feedforward_layernorm"}
POINTS = ("resid_pre", "resid_mid", "resid_post")


def parallel(family: str) -> bool:
    return bool(getattr(REAL[family][0], "use_parallel_residual", False))


def batch(chosen) -> torch.Tensor:
    return next(compile_plan(make_config(*chosen)).data.batches(0, torch.device("cpu"))).x


def where_read(family: str, b: int) -> dict[str, str]:
    """Each residual point of block ``b``: the key ``hand_pass`` reads it under (a module's output, or
    ``NAME input``: its first input)."""
    block = f"{parts_of(family)['block']}.{b}"
    return {"resid_pre": f"{block} input", "resid_mid": f"{block}.{LN2.get(family, 'post_attention_layernorm')} input",
            "resid_post": block}


def edited_pass(folder, x: torch.Tensor, edits: dict) -> dict[str, torch.Tensor]:
    """The saved model in float64 on ``x`` with ``edits`` (module -> function of its output) as plain forward
    hooks: every module's output, by name."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval().double()
    read, handles = {}, []
    for name, module in model.named_modules():
        if name in edits:
            handles.append(module.register_forward_hook(lambda m, a, out, f=edits[name]: f(out)))
        handles.append(module.register_forward_hook(lambda m, a, out, name=name: read.setdefault(name, out)))
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return read


def kept(run_dir: Path, **where) -> torch.Tensor:
    rows = analysis.load_tensors(run_dir)
    for key, value in where.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, where
    return torch.as_tensor(rows.tensor.iloc[0]).double()


@pytest.mark.parametrize("family", list(REAL))
def test_each_residual_point_is_the_tensor_plain_hooks_read_named_alike_in_every_family(folders, tmp_path, family):
    points = [p for p in POINTS if not (p == "resid_mid" and parallel(family))]
    chosen = overrides(folders[family], "hooks=extract", f"hooks.extract.layers=[{','.join(f'blocks.*.{p}' for p in points)}]",
                       "hooks.extract.kinds=[output]")
    got = analysis.load_tensors(run(make_config(*chosen), tmp_path / "run", chosen))
    _, _, read = hand_pass(folders[family], chosen)
    assert len(got) == 2 * len(points) and set(got.slot) == {"0"}
    for b in (0, 1):
        for point, key in where_read(family, b).items():
            if point not in points:
                continue
            row = got[got.canonical == f"blocks.{b}.{point}"]
            assert len(row) == 1, point
            assert (row.layer.iloc[0], row.kind.iloc[0]) == (key.removesuffix(" input"), "input" if "input" in key else "output")
            torch.testing.assert_close(torch.as_tensor(row.tensor.iloc[0]).double(), read[key], rtol=1e-5, atol=1e-5,
                                       msg=f"{family} {point} {b}")


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])  # no dropout: the run trains (GPT-2 drops)
def test_gradients_at_residual_points_are_the_gradients_autograd_gives(folders, tmp_path, family):
    """``kinds=[grad_output]`` at ``resid_pre`` and ``resid_post`` of block 1: the gradient of the loss (the
    logits' sum) with respect to the block's input and output, as ``torch.autograd.grad`` gives it."""
    chosen = ("model=hf", f"model.path={folders[family]}", "model.auto=causal_lm", "data=tokens", "loss=sum", "steps=1",
              "hooks=stats", "hooks.stats.kinds=[grad_output]", "hooks.stats.layers=[blocks.1.resid_pre,blocks.1.resid_post]")
    stats = analysis.load_stats(run(make_config(*chosen), tmp_path / "run", chosen))
    model = transformers.AutoModelForCausalLM.from_pretrained(folders[family], attn_implementation="eager").double()
    block = model.get_submodule(f"{parts_of(family)['block']}.1")
    seen = {}
    handle = block.register_forward_hook(lambda m, args, out: seen.update(resid_pre=args[0], resid_post=out))
    logits = model(batch(chosen)).logits
    handle.remove()
    grads = dict(zip(seen, torch.autograd.grad(logits.sum(), list(seen.values()))))
    assert sorted(zip(stats.canonical, stats.kind, stats.slot)) == [
        ("blocks.1.resid_post", "grad_output", "0"), ("blocks.1.resid_pre", "grad_input", "0")]
    for point, grad in grads.items():
        row = stats[stats.canonical == f"blocks.1.{point}"].iloc[0]
        assert row.l2 == pytest.approx(float(grad.norm()), rel=1e-5), point
        for stat in ("max", "min"):
            assert row[stat] == pytest.approx(float(getattr(grad, stat)()), rel=1e-4), (point, stat)


def mean_over_batch(out: torch.Tensor) -> torch.Tensor:
    return out.mean(0, keepdim=True).expand_as(out)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "gemma2"])
def test_edits_at_resid_post_change_the_block_s_output_as_plain_hooks_do(folders, tmp_path, family):
    """``ablate`` (the batch mean), ``steer`` (a vector from a file) and ``patch`` (another run's values) at
    ``blocks.0.resid_post``, each read at ``blocks.1.resid_post`` (a capture after the edit), equal a plain
    forward hook changing block 0's output the same way."""
    block = parts_of(family)["block"]
    vector = np.linspace(-1, 1, REAL[family][0].hidden_size if family != "gpt2" else 16)
    np.save(tmp_path / "vector.npy", vector)
    read_after = ("hooks.extract.layers=[blocks.1.resid_post]", "hooks.extract.kinds=[output]")
    source = overrides(folders[family], "hooks=extract", "hooks.extract.layers=[blocks.0.resid_post]", "data.seed=5")
    source_dir = run(make_config(*source), tmp_path / "source", source)
    stored = kept(source_dir, canonical="blocks.0.resid_post")
    ways = {
        "ablate": (("hooks=[ablate,extract]", "hooks.ablate.layers=blocks.0.resid_post", "hooks.ablate.op=mean"),
                   mean_over_batch),
        "steer": (("hooks=[steer,extract]", "hooks.steer.layers=blocks.0.resid_post", f"hooks.steer.file={tmp_path}/vector.npy",
                   "hooks.steer.scale=2", "hooks.steer.baseline=false"), lambda out: out + 2 * torch.as_tensor(vector)),
        "patch": (("hooks=[patch,extract]", "hooks.patch.layers=blocks.0.resid_post", f"hooks.patch.source={source_dir}"),
                  lambda out: stored.expand_as(out)),
    }
    for name, (edit, plain) in ways.items():
        chosen = overrides(folders[family], *edit, *read_after)
        got = kept(run(make_config(*chosen), tmp_path / name, chosen), canonical="blocks.1.resid_post")
        x = batch(chosen)
        want = edited_pass(folders[family], x, {f"{block}.0": plain})[f"{block}.1"]
        unedited = edited_pass(folders[family], x, {})[f"{block}.1"]
        assert (want - unedited).abs().max() > 1e-2, name  # the edit changes what block 1 gives
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{family} {name}")


def test_what_a_residual_point_cannot_be_is_one_line_each(folders, tmp_path, capsys):
    neox = folders["gpt_neox"]
    assert refused(capsys, tmp_path, *overrides(neox, "hooks=stats", "hooks.stats.kinds=[output]", "hooks.stats.layers=blocks.*.resid_mid")) == (
        "error: hooks.stats.layers: 'blocks.*.resid_mid': the gpt_neox blocks of this model run attention and MLP in "
        "parallel (use_parallel_residual=true), so no residual stream lies between them; read blocks.i.resid_pre or "
        "blocks.i.resid_post")
    assert refused(capsys, tmp_path, *overrides(folders["llama"], "hooks=ablate", "hooks.ablate.layers=blocks.1.resid_pre")) == (
        "error: hooks.ablate.layers: 'model.layers.1' is selected through a residual point read at its input "
        "(blocks.i.resid_pre, resid_mid), which is read, not changed: blocks.i.resid_pre is the tensor "
        "blocks.(i-1).resid_post is, change that; resid_mid's block adds to the stream it holds itself, which a "
        "change at the norm's input would not reach")
    assert refused(capsys, tmp_path, *overrides(folders["llama"], "hooks=logit_lens",
                                               "hooks.logit_lens.layers=blocks.*.resid_post")) == (
        "error: hooks.logit_lens.layers: a residual point (blocks.i.resid_pre, resid_mid, resid_post) is one tensor "
        "of a module's call ('model.layers.0' output), and 'logit_lens' hooks whole modules; select the module (blocks.i)")


def test_stats_of_runs_over_three_families_load_as_one_table_by_canonical_name(folders, tmp_path):
    """``stats.parquet`` names each row: by the residual point its tensor is (a block's output slot 0, however it
    was selected), by its module's canonical name, or null (a module the vocabulary does not name)."""
    own_act = {"gpt2": "transformer.h.0.mlp.act", "llama": "model.layers.0.mlp.act_fn", "gpt_neox": "gpt_neox.layers.0.mlp.act"}
    for family, act in own_act.items():
        chosen = overrides(folders[family], "hooks=stats", "hooks.stats.kinds=[output]",
                           f"hooks.stats.layers=[blocks.*,blocks.*.mlp,{act}]")
        run(make_config(*chosen), tmp_path / "runs" / family, chosen)
    stats = analysis.load_stats(tmp_path / "runs")
    assert stats.groupby(["model.path"]).size().tolist() == [2 * 2 + 1] * 3
    named = stats.dropna(subset=["canonical"])
    assert sorted(named.canonical.unique()) == ["blocks.0.mlp", "blocks.0.resid_post", "blocks.1.mlp", "blocks.1.resid_post"]
    assert named.groupby("canonical").layer.nunique().tolist() == [3] * 4  # one module of each family per name
    assert sorted(stats[stats.canonical.isna()].layer) == sorted(own_act.values())
    mlp = run(make_config("model=mlp", "data=randn", "steps=1", "hooks=stats", "hooks.stats.kinds=[output]"),
              tmp_path / "mlp", ())
    assert analysis.load_stats(mlp).canonical.isna().all()  # a model of no transformer family names nothing


def command_line_refuses(monkeypatch, capsys, out: Path, *argv: str) -> list[str]:
    """``python -m runner ARGV hydra.run.dir=OUT`` (its ``main``, in this process): status 2, nothing written under
    ``out``; the lines it printed, the library's notes on the test configs' token ids (``[transformers]``) aside."""
    done = run_main(monkeypatch, capsys, *argv, f"hydra.run.dir={out}")
    assert done.code == 2, done.stderr
    assert not out.exists() or not any(out.iterdir())
    return [x for x in done.stderr.splitlines() if x.strip() and not x.startswith("[transformers]")]


@pytest.mark.parametrize(("family", "selector", "line"), [
    ("gpt2", "blocks.0.attn.q_norm", "'blocks.0.attn.q_norm': the gpt2 family has no attn.q_norm (qwen3, gemma3 have "
     "one); its blocks have ln1, attn, attn.out, ln2, mlp, resid_pre, resid_mid, resid_post; did you mean 'blocks.0.attn.out'?"),
    ("llama", "blocks.99.mlp", "'blocks.99.mlp': this model has blocks 0 to 1; did you mean 'blocks.1.mlp'?"),
    ("llama", "blocks.0.attn.hook_z", "'blocks.0.attn.hook_z' is neither a module of this model nor a name of its "
     "family's vocabulary (llama: embed, blocks, blocks.0, blocks.0.ln1, blocks.0.attn, blocks.0.attn.out, blocks.0.ln2, "
     "blocks.0.mlp, ln_final, unembed, blocks.0.resid_pre, blocks.0.resid_mid, blocks.0.resid_post, ...); did you mean "
     "'blocks.0.attn.out'?"),
])
def test_a_name_the_family_lacks_is_one_line_on_the_command_line(folders, tmp_path, monkeypatch, capsys, family,
                                                                  selector, line):
    """``python -m runner``'s ``main``: status 2, the one line, no traceback, nothing written (a plan's refusal in a
    real process: ``tests/test_faults.py``'s rejected sweep, marked slow; a mistake's: ``tests/test_startup.py``)."""
    assert command_line_refuses(monkeypatch, capsys, tmp_path / "out", *overrides(
        folders[family], "hooks=stats", "hooks.stats.kinds=[output]", f"hooks.stats.layers={selector}")) == [
        f"error: hooks.stats.layers: {line}"]


def test_a_path_from_a_part_its_family_norms_before_the_residual_is_one_line(folders, tmp_path, monkeypatch, capsys):
    """Gemma adds ``post_attention_layernorm(attn(x))`` to the stream: a path from ``blocks.0.attn`` would send the
    receiver the attention's change, not what the stream got (a wrong delta, silently): refused, naming the norm;
    from the norm (``blocks.0.ln_attn_out``) it runs."""
    path = ("hooks=patch", "hooks.patch.source=clean", "hooks.patch.receiver=blocks.1", "hooks.patch.index=15",
            "data.seed=1")
    assert command_line_refuses(monkeypatch, capsys, tmp_path / "out", *overrides(
        folders["gemma2"], *path, "hooks.patch.layers=blocks.0.attn", "hooks.patch.slot=0")) == [
        "error: hooks.patch.layers: 'model.layers.0.self_attn' (blocks.0.attn) reaches the residual stream "
        "through blocks.0.ln_attn_out ('model.layers.0.post_attention_layernorm', a norm of the gemma2 "
        "family), so its change is not what the receiver would be sent; send from blocks.0.ln_attn_out"]
