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
        if torch.get_default_device().type != "meta":  # the runner's meta-device rehearsal is not the run
            type(self).instances.append(self)


class Exploding(Tracked):
    """Linear(3, 3) whose forward raises after the first layer ran (hooks already fired)."""

    instances: list[nn.Module] = []
    error: type[BaseException] = RuntimeError

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        if x.device.type == "meta":  # the runner's rehearsal: fail in the real run only
            return out
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


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.log()


class PoisonedAtStep2(Tracked):
    """fc1 -> log -> fc2; from the third forward on, ``log`` gets negative input and yields NaN."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.log = Log()
        self.fc2 = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x).abs() + 1
        if self.calls >= 2:
            h = -h
        self.calls += 1
        return self.fc2(self.log(h))


class MiniResNet(Tracked):
    """A resnet's names and traps at toy size: ``conv1``, ``bn1``, one in-place ``relu`` called
    twice, a residual ``layer4``, ``avgpool`` and the ``fc`` head, so every hook preset applies."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.layer4 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.layer4(x) + x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SelfTerminated(Exploding):
    """As ``Exploding``, but the process receives SIGTERM in the middle of the forward pass."""

    instances: list[nn.Module] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import os
        import signal

        out = self.fc(x)
        if x.device.type == "meta":
            return out
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the forward pass")


class CalledTwice(Tracked):
    """One Linear called twice per forward, on different inputs, its outputs weighted 1 and 3, so
    the two calls' inputs and gradients differ; each call's input feeds that call only."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x + 0) + 3 * self.fc(2 * x)


class IdentityThenInplace(Tracked):
    """Linear -> Identity -> ReLU(inplace=True) -> Linear: the Identity's output is its input, which
    the ReLU then changes in place (PyTorch drops a hook on the Identity's input view)."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.id, self.relu, self.fc2 = nn.Linear(3, 3), nn.Identity(), nn.ReLU(inplace=True), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.id(self.fc1(x))))


class Recurrent(Tracked):
    """An LSTM over ``[batch, time, 3]`` whose head reads its last output and ``h_n``: an output
    of three tensors (slots 0, 1.0, 1.1), two of which get a gradient."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.fc = nn.LSTM(3, 4, batch_first=True), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h_n, _) = self.lstm(x)
        return self.fc(torch.cat([out[:, -1], h_n[-1]], dim=1))


class GradProbe(nn.Module):
    """Identity that notes, per call, whether autograd was recording (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(torch.is_grad_enabled())
        return x


class SequentialDigits(nn.Sequential):
    """A model that is a sequence of modules, for digits: conv, relu, conv, relu, flatten, linear, probe."""

    instances: list[nn.Module] = []

    def __init__(self) -> None:
        super().__init__(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 10), GradProbe())
        if torch.get_default_device().type != "meta":
            type(self).instances.append(self)
