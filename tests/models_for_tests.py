"""Small modules that tests name through ``model._target_``; each remembers its instances."""
from __future__ import annotations

import torch
import torch.nn.utils.parametrize
import torchvision
from torch import nn


class Tracked(nn.Module):
    """Keeps every instance so a test can inspect the model a run built and threw away."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        type(self).instances.append(self)


class Exploding(Tracked):
    """Linear(3, 3) whose forward raises after the first layer ran (hooks already fired)."""

    instances: list[nn.Module] = []
    error: type[BaseException] = RuntimeError

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc(x)
        raise self.error("boom in forward")


class Interrupted(Exploding):
    """As ``Exploding``, but the user pressed Ctrl-C."""

    instances: list[nn.Module] = []
    error = KeyboardInterrupt


class TrackedResNet18(torchvision.models.ResNet, Tracked):
    """torchvision's resnet18, remembered."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:  # ResNet's super().__init__() reaches Tracked, which records us
        super().__init__(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2])


class TwoOutputs(Tracked):
    """Returns a tuple and a dict inside it, to check slot naming."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.split = Splitter()

    def forward(self, x: torch.Tensor):
        return self.split(self.fc(x))


class Splitter(nn.Module):
    def forward(self, x: torch.Tensor):
        return x * 2, {"half": x / 2, "none": None}


class Scaler(nn.Module):
    """Takes its input as a keyword, the way Hugging Face blocks are called."""

    def forward(self, *, hidden: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        return hidden * factor


class KwargsNet(Tracked):
    """Linear(3, 3) -> Scaler called with keywords only -> Linear(3, 2)."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.scale = Scaler()
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.scale(hidden=self.fc1(x), factor=3.0))


class MakesModules(Tracked):
    """Builds a fresh ``nn.Tanh`` inside every forward: only global hooks can see it."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Tanh()(self.fc(x))


class ParametrizedNet(Tracked):
    """A Linear whose ``weight`` is computed from a parametrization (not a leaf)."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        torch.nn.utils.parametrize.register_parametrization(self.fc, "weight", Doubler())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Doubler(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 2
