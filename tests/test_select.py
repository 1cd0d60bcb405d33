"""Selectors: names, globs, re:, type:, leaf:, lists, the root, and helpful errors."""
from __future__ import annotations

import re
from collections import OrderedDict

import pytest
import torchvision
from torch import nn

from common.errors import ConfigError
from hooks.mechanism.select import select_modules
from runner.sources.models import ConvNet


@pytest.fixture(scope="module")
def resnet():
    return torchvision.models.resnet18()


def names(model, selector):
    return [n for n, _ in select_modules(model, selector, "hooks.x.layers")]


def test_exact_glob_regex_type_and_leaf(resnet):
    assert names(resnet, "layer4.0.conv1") == ["layer4.0.conv1"]
    assert names(resnet, "layer1.*.conv1") == ["layer1.0.conv1", "layer1.1.conv1"]
    assert names(resnet, "*") == [n for n, _ in resnet.named_children()]
    assert names(resnet, "re:layer[12]\\.0\\.bn\\d") == ["layer1.0.bn1", "layer1.0.bn2", "layer2.0.bn1", "layer2.0.bn2"]
    assert names(resnet, "type:Linear") == ["fc"]
    assert names(resnet, "type:torch.nn.modules.linear.Linear") == ["fc"]
    leaves = names(resnet, "leaf:**")
    assert len(leaves) == sum(1 for _, m in resnet.named_modules() if not list(m.children()))
    assert "layer1" not in leaves and "layer1.0.relu" in leaves


def test_lists_union_in_model_order_and_each_module_once(resnet):
    assert names(resnet, ["fc", "conv1", "fc", "type:Linear"]) == ["conv1", "fc"]


def test_root_is_selected_only_by_empty_string_and_double_star():
    net = ConvNet()
    assert names(net, "") == [""]
    assert "" in names(net, "**") and "" not in names(net, "*")
    assert names(nn.Linear(3, 3), "leaf:**") == [""]


def test_module_under_two_names_is_hooked_once():
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    assert names(model, ["0", "2"]) == ["0"]


@pytest.mark.parametrize("selector, message", [
    ("layer5", "hooks.x.layers: 'layer5' matches no module; did you mean 'layer4'"),
    ("type:Conv3d", "no module of class 'Conv3d'; classes in this model: "),
    ("type:conv2d", "did you mean 'type:Conv2d'?"),
    ("re:(", "invalid regular expression"),
    ([], "empty selector"),
    ("leaf:layer1", "none of them is a leaf"),
])
def test_bad_selectors_explain_themselves(resnet, selector, message):
    with pytest.raises(ConfigError, match=None) as err:
        select_modules(resnet, selector, "hooks.x.layers")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("written, meant", [("_orig_mod.conv", "conv"), ("module.conv", "conv"),
                                            ("_orig_mod.module.fc", "fc")])
def test_a_name_with_a_compile_or_wrapper_prefix_suggests_the_real_name(written, meant):
    model = nn.Sequential(OrderedDict(conv=nn.Conv2d(1, 1, 1), fc=nn.Linear(1, 1)))
    with pytest.raises(ConfigError, match=rf"'{re.escape(written)}' matches no module; did you mean '{meant}'\?"):
        select_modules(model, written, "hooks.x.layers")


def test_a_bare_name_on_a_wrapped_model_suggests_the_wrapped_name():
    wrapper = nn.Module()
    wrapper.module = nn.Sequential(OrderedDict(conv=nn.Conv2d(1, 1, 1)))
    with pytest.raises(ConfigError, match=r"did you mean 'module.conv'\?"):
        select_modules(wrapper, "conv", "hooks.x.layers")
