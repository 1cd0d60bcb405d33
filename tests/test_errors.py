"""User mistakes: one line naming the key, the valid choices and the closest; nothing written."""
from __future__ import annotations

import pytest

from conftest import hook_count, make_config
from hooks.errors import ConfigError
from models_for_tests import Exploding
from runner.run import run


@pytest.mark.parametrize("overrides, message", [
    (["hooks=clip", "hooks.clip.type=clmap"],
     "hooks.clip.type: unknown hook type 'clmap'; valid: "),
    (["hooks=clip", "+hooks.clip.maxx=1"],
     "hooks.clip.maxx: unknown key 'maxx'; valid: always_call, layers, max, min, params, prepend, scope, target, "
     "type; did you mean 'max'?"),
    (["hooks=clip", "hooks.clip.max=big"], "hooks.clip.max: "),
    (["hooks=clip", "hooks.clip.min=1", "hooks.clip.max=0"], "hooks.clip: min (1.0) > max (0.0); swap them"),
    (["hooks=clip", "hooks.clip.min=null", "hooks.clip.max=null"], "hooks.clip: set min, max or both"),
    (["hooks=clip", "hooks.clip.target=outputs"], "hooks.clip.target: unknown target 'outputs'; valid: input, output, params; did you mean 'output'?"),
    (["hooks=zero_bias", "hooks.zero_bias.params=[bais]"], "hooks.zero_bias.params: unknown parameter 'bais'; valid: bias, weight; did you mean 'bias'?"),
    (["hooks=stats", "hooks.stats.kinds=[outputs]"], "did you mean 'output'?"),
    (["hooks=extract", "model=convnet"], "hooks.extract.layers: 'layer4' matches no module"),
    (["model=resnet18", "hooks=extract", "hooks.extract.layers=[layer4,avgpol]"], "'avgpol' matches no module; did you mean 'avgpool'"),
    (["hooks=clip", "loss=none"], "hooks.clip: 'clamp' needs a backward pass but loss=none"),
    (["hooks=stats", "loss=none"], "hooks.stats: 'stats' needs a backward pass but loss=none"),
    (["model.name=resnet19"], "model.name: unknown model 'resnet19'; valid: "),
    (["loss.name=crossentropy"], "did you mean 'cross_entropy'?"),
    (["model=custom"], "model._target_: required for model=custom"),
    (["model=custom", "model._target_=nowhere.Net"], "model._target_: cannot build 'nowhere.Net'"),
    (["model.checkpoint=/nonexistent.pt"], "model.checkpoint: no file at '/nonexistent.pt'"),
    (["data=image"], "data.path: required for data=image"),
    (["data.shape=[0,3]"], "data.shape: [0, 3] must be a list of positive integers"),
    (["mode=training"], "mode: unknown mode 'training'; valid: eval, train; did you mean 'train'?"),
    (["steps=0"], "steps: 0 must be at least 1"),
])
def test_config_errors_are_one_line_and_write_nothing(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        run(make_config("model=convnet", *overrides) if not any(o.startswith("model=") for o in overrides)
            else make_config(*overrides), tmp_path / "out")
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    assert not (tmp_path / "out").exists()


def test_exception_in_forward_leaves_no_hook_behind(tmp_path):
    Exploding.instances.clear()
    cfg = make_config("model=custom", "model._target_=models_for_tests.Exploding", "data.shape=[2,3]",
                      "hooks=[stats,clip,shift,print]", "hooks.print.layers=fc", "hooks.shift.layers=fc")
    with pytest.raises(RuntimeError, match="boom"):
        run(cfg, tmp_path / "out")
    (model,) = Exploding.instances
    assert hook_count(model) == 0
