"""plan=true: modules, matches, PyTorch hooks and capture sizes, computed on the meta device."""
from __future__ import annotations

import time

import pytest
import torch
import torchvision

import runner.analysis as analysis

from conftest import make_config
from runner.cli.execute import execute


def test_plan_lists_modules_matches_and_exact_capture_bytes(capsys, tmp_path):
    execute(make_config("plan=true", "model=resnet18", "data.shape=[2,3,32,32]", "hooks=[stats,extract]"),
            tmp_path, [])
    text = capsys.readouterr().out
    assert "  layer4.1.conv2                   Conv2d               [2, 512, 1, 1]" in text
    assert "hooks.stats (type stats): register_forward_hook + Tensor.register_hook on output" in text
    assert "hooks.extract (type capture): register_forward_hook\n  2 module(s): layer4, avgpool" in text

    model = torchvision.models.resnet18()
    calls, nbytes = 0, 0
    for m in model.modules():
        if not list(m.children()):
            def count(_m, _i, out):
                nonlocal calls, nbytes
                calls += 1
                nbytes += out.numel() * 4
            m.register_forward_hook(count)
    with torch.no_grad():
        model(torch.zeros(2, 3, 32, 32))
    assert f"hooks.stats: {calls} output tensor(s), {nbytes / 2**20:.1f} MiB seen" in text
    assert f"hooks.stats: {calls} grad_output tensor(s)" in text
    assert not list(tmp_path.iterdir())  # a plan writes nothing


def test_plan_reports_a_bad_selector_with_suggestions_and_exits_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        execute(make_config("plan=true", "model=convnet", "hooks=extract", "hooks.extract.layers=[fcc]"), tmp_path, [])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: hooks.extract.layers: 'fcc' matches no module; did you mean 'fc'")
    assert "  fc                               Linear               [1, 5]" in out  # the names to choose from


def test_one_cli_run_builds_its_hooks_data_and_rehearsal_once(monkeypatch, tmp_path):
    """The command-line check compiles the plan; Hydra's job runs that plan, it does not compile again."""
    import sys

    import runner.__main__ as main
    import runner.engine.plan as plan_module

    counts = {"build_hooks": 0, "rehearse": 0, "DataSource": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for name in counts:
        monkeypatch.setattr(plan_module, name, counted(name, getattr(plan_module, name)))
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["runner", "model=convnet", "hooks=[stats,clip]", f"hydra.run.dir={out}"])
    main.main()
    assert counts == {"build_hooks": 1, "rehearse": 1, "DataSource": 1}
    assert (out / "manifest.json").exists()


@pytest.mark.parametrize("overrides, warmed", [
    (("model=resnet18", "data.shape=[1,3,64,64]", "hooks=stats"), [("cpu", 0)]),
    (("model=convnet", "hooks=stats"), [("cpu", 0)]),  # small tensors too: the C kernel takes every size on CPU
    (("model=convnet", "hooks=none"), []),              # nothing recorded: nothing built
])
def test_the_statistics_kernel_is_built_before_step_0_not_inside_it(monkeypatch, tmp_path, watch, overrides, warmed):
    import json

    from conftest import run
    from hooks.kernels import stats

    calls, build_s, clock = [], 1000.0, time.perf_counter
    skipped = [0.0]  # a build that takes build_s, on the run's clock: in compile_time_s, not in step 0's wall time
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + skipped[0])

    def prepare(device):
        calls.append((device.type, watch.forwards))
        skipped[0] += build_s

    monkeypatch.setattr(stats, "prepare", prepare)
    out = run(make_config(*overrides), tmp_path / "run")
    assert calls == warmed  # forwards seen when the kernel was built: none yet
    compile_time_s = json.loads((out / "manifest.json").read_text())["compile_time_s"]
    step_0 = analysis.load_steps(out).wall_time_s.iloc[0]
    if warmed:
        assert compile_time_s >= build_s > step_0
    else:
        assert compile_time_s < build_s
