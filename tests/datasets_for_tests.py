"""Datasets that tests name through ``data._target_``."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset


def labelled(n: int = 40, classes: int = 5) -> TensorDataset:
    """``n`` seeded [3, 8, 8] images (``convnet``'s input) with labels in ``[0, classes)``."""
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, classes, (n,), generator=gen))


class Squares(Dataset):
    """Item ``i`` is the [100] vector of ``i``'s, unlabelled (``mlp``'s input): a class, not a function."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((100,), float(i))


class Stream(IterableDataset):
    """Three [100] vectors and then no more: an IterableDataset has no length to count epochs in."""

    def __iter__(self):
        return (torch.full((100,), float(i)) for i in range(3))


def not_a_dataset(n: int = 3) -> list:
    """Annotated to return a list: refused without being called."""
    raise AssertionError("called")


class ImagesFailingAt(Dataset):
    """The images of an ``ImageFolder`` (32x32, normalised as ``data=imagefolder``) whose item ``fail_at``
    raises: a pass killed mid-way (``fail_at=-1``: none does)."""

    def __init__(self, path: str, fail_at: int = -1) -> None:
        from torchvision import datasets, transforms

        self.fail_at = fail_at
        self.folder = datasets.ImageFolder(path, transform=transforms.Compose([
            transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise RuntimeError(f"item {i}: the pass is killed here")
        return self.folder[i]


class DigitsPausingAt(Dataset):
    """scikit-learn's digits as [1, 8, 8] images (``digits_cnn``'s input) with their labels; reading item
    ``pause_at`` creates the file ``flag`` and then waits: a pass a test kills there with a signal."""

    def __init__(self, pause_at: int = -1, flag: str = "") -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        self.x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
        self.y = torch.tensor(digits.target)
        self.pause_at, self.flag = pause_at, flag

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i == self.pause_at:
            import time
            from pathlib import Path

            Path(self.flag).touch()
            time.sleep(600)
        return self.x[i], self.y[i]
