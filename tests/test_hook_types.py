"""Every registered hook type has a preset, runs from it, and leaves the model as it found it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from conftest import hook_count, make_config, run
from hooks import HOOK_TYPES
from models_for_tests import Exploding, Interrupted, TrackedResNet18
from sae_folders import random_saelens
from transcoder_folders import saelens_transcoder

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "hooks").glob("*.yaml"))
HOOK_PRESETS = [p for p in PRESETS if p != "none"]


def test_every_hook_type_has_a_preset():
    used = {make_config(f"hooks={p}", "model=resnet18").hooks[p].type for p in HOOK_PRESETS}
    assert used == set(HOOK_TYPES)


#: Presets whose default layers do not fit a ResNet (the tutorial applies them to model=linear).
RESNET_OVERRIDES = {"residual": ["hooks.residual.layers=type:ReLU"], "sae": ["hooks.sae.layers=layer3.1"],
                    "transcoder": ["hooks.transcoder.layers=layer3.1"]}


def needed(preset: str, tmp_path: Path, width: int) -> list[str]:
    """What a preset needs that no default can give: ``store`` a directory of its own, ``attribution``
    a metric to differentiate, ``steer`` a vector of the steered layer's ``width``, ``sae`` an SAE and
    ``transcoder`` a transcoder that wide."""
    if preset == "sae":
        return [f"hooks.sae.path={random_saelens(tmp_path / 'sae', width)}"]
    if preset == "transcoder":
        return [f"hooks.transcoder.path={saelens_transcoder(tmp_path / 'transcoder', width, width)}"]
    if preset == "steer":
        np.save(tmp_path / "vector.npy", np.linspace(-1, 1, width))
        return [f"hooks.steer.file={tmp_path / 'vector.npy'}"]
    return {"store": [f"hooks.store.path={tmp_path / 'store'}"], "attribution": ["metric.diff=[1,2]"],
            "dla": ["hooks.dla.diff=[1,2]"]}.get(preset, [])


#: ``logit_lens`` and ``dla`` read causal language models only, ``graph`` the transcoders of one: a resnet is
#: refused before the run, with what it lacks (their hooks on gpt2_tiny: ``tests/test_isolation.py``).
REFUSED_ON_A_RESNET = {"logit_lens": "valid: model=gpt2_tiny, model=hf model.auto=causal_lm",
                       "dla": "valid: model=gpt2_tiny, model=hf model.auto=causal_lm",
                       "graph": "no transcoder entry is listed before it"}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_and_removes_its_hooks(tmp_path, preset):
    extra = list(RESNET_OVERRIDES.get(preset, [])) + needed(preset, tmp_path, 256)  # layer3's channels
    if preset == "patch":  # its source: a run that kept layer3's output
        source = run(make_config("hooks=extract", "hooks.extract.layers=layer3", "data.shape=[2,3,32,32]"),
                     tmp_path / "source")
        extra.append(f"hooks.patch.source={source}")
    TrackedResNet18.instances.clear()
    cfg = make_config(f"hooks={preset}", "model=resnet18", "+model._target_=models_for_tests.TrackedResNet18",
                      "data.shape=[2,3,32,32]", *extra)
    if preset in REFUSED_ON_A_RESNET:
        with pytest.raises(ConfigError, match=REFUSED_ON_A_RESNET[preset]):
            run(cfg, tmp_path / "out")
        return
    out = run(cfg, tmp_path / "out")
    assert (out / "manifest.json").is_file()
    (model,) = TrackedResNet18.instances
    assert hook_count(model) == 0


#: ``patch`` needs a stored run of the model's outputs, which a model that fails in forward cannot make;
#: its hooks are the Tap's forward hooks, removed as ``edit_output``'s are.
#: ``REFUSED_ON_A_RESNET`` refuse these models before their forward (their hooks on a failing gpt2_tiny: ``tests/test_isolation.py``).
@pytest.mark.parametrize("preset", [p for p in HOOK_PRESETS if p != "patch" and p not in REFUSED_ON_A_RESNET])
@pytest.mark.parametrize("model_cls", [Exploding, Interrupted], ids=["exception", "ctrl-c"])
def test_preset_removes_its_hooks_when_forward_fails(tmp_path, preset, model_cls):
    model_cls.instances.clear()
    cfg = make_config(f"hooks={preset}", "model=custom", f"model._target_=models_for_tests.{model_cls.__name__}",
                      "data.shape=[2,3]", f"hooks.{preset}.layers=**", "model.head=fc", *needed(preset, tmp_path, 3))
    with pytest.raises(model_cls.error):
        run(cfg, tmp_path / "out")
    (model,) = model_cls.instances
    assert hook_count(model) == 0
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("preset", HOOK_PRESETS)
def test_every_preset_lists_every_key_so_overrides_need_no_plus(preset):
    import dataclasses

    entry = make_config(f"hooks={preset}", "model=resnet18").hooks[preset]
    fields = {f.name for f in dataclasses.fields(HOOK_TYPES.get(entry.type).schema)}
    assert set(entry.keys()) == fields


@pytest.mark.parametrize("preset", HOOK_PRESETS)
def test_every_preset_file_holds_only_what_differs_from_its_type(preset):
    """Presets inherit their type's schema (``/hook_schema/TYPE``): a key repeating a default is noise."""
    import yaml

    from hydra.core.config_store import ConfigStore

    from runner.config.compose import CONF_DIR

    text = yaml.safe_load((CONF_DIR / "hooks" / f"{preset}.yaml").read_text()) or {}
    (inherited,) = [d for d in text.pop("defaults", []) if d != "_self_"]
    type_name = inherited.removeprefix("/hook_schema/").removesuffix("@_here_")
    defaults = ConfigStore.instance().load(f"hook_schema/{type_name}.yaml").node
    same = [k for k, v in text.items() if k != "layers" and k in defaults and defaults[k] == v]
    assert not same, f"{preset}.yaml repeats the defaults of {same}"
