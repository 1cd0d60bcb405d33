"""``data=dataset``, ``data=imagefolder`` and ``epochs``: any Dataset, batched by a seeded DataLoader."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, random_split
from torchvision import datasets, transforms

from common.errors import ConfigError
import runner.analysis as analysis
from conftest import make_config
from datasets_for_tests import labelled
from runner.engine.plan import compile_plan
from runner.sources.models import ConvNet

LABELLED = ("model=convnet", "data=dataset", "data._target_=datasets_for_tests.labelled", "data.batch_size=8",
            "loss=cross_entropy", "optimizer=sgd", "optimizer.lr=0.1", "progress=false")


def test_a_dataset_trains_as_a_hand_written_dataloader_loop(run_with):
    """Epochs of shuffled batches from the run's seed, eval passes on the held-out part: losses and accuracies
    equal plain PyTorch's over ``random_split`` and a ``DataLoader`` seeded the same way."""
    steps = analysis.load_steps(run_with(*LABELLED, "data.held_out=0.25", "epochs=2", "eval_every=3"))
    train_part, held_part = random_split(labelled(), [30, 10], generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(train_part, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    held_x, held_y = next(iter(DataLoader(held_part, batch_size=8)))
    train, evals, step = [], [], 0
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            train.append((loss.item(), (out.argmax(1) == y).float().mean().item()))
            loss.backward()
            opt.step()
            if (step + 1) % 3 == 0:
                with torch.no_grad():
                    out = model(held_x)
                evals.append((F.cross_entropy(out, held_y).item(), (out.argmax(1) == held_y).float().mean().item()))
            step += 1
    assert step == 8  # 2 epochs of ceil(30 / 8) batches, the last one of 6
    np.testing.assert_allclose(steps[steps.split == "train"][["loss", "accuracy"]].to_numpy(), train, rtol=1e-5)
    np.testing.assert_allclose(steps[steps.split == "eval"][["loss", "accuracy"]].to_numpy(), evals, rtol=1e-5)


def test_worker_processes_load_the_same_batches_as_the_main_process(run_with):
    one, two = (analysis.load_steps(run_with(*LABELLED, "steps=6", f"data.num_workers={n}")) for n in (0, 2))
    np.testing.assert_array_equal(one[["loss", "accuracy"]].to_numpy(), two[["loss", "accuracy"]].to_numpy())


def test_a_dataset_class_without_labels_cycles_in_order_with_a_partial_last_batch(run_with):
    run_dir = run_with("model=mlp", "data=dataset", "data._target_=datasets_for_tests.Squares", "+data.kwargs.n=10",
                       "data.batch_size=4", "data.shuffle=false", "steps=4", "loss=none", "hooks=extract",
                       "hooks.extract.layers=fc1", "hooks.extract.kinds=[input]")
    inputs = analysis.load_tensors(run_dir).sort_values("step")
    firsts = [[float(v) for v in t[:, 0]] for t in inputs.tensor]
    assert firsts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]


def _png_folder(root, classes=("cat", "dog"), per_class=2):
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((12, 12, 3), 40 + 100 * c + 30 * i, dtype=np.uint8)
            pixels[::3, ::2, c] = 250
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_an_image_folder_takes_labels_from_folder_names_with_the_imagenet_transforms(run_with, tmp_path):
    folder = _png_folder(tmp_path / "images")
    steps = analysis.load_steps(run_with("model=convnet", "data=imagefolder", f"data.path={folder}", "data.resize=8",
                                         "data.crop=8", "data.batch_size=4", "data.shuffle=false",
                                         "loss=cross_entropy", "steps=1", "progress=false"))
    prepare = transforms.Compose([transforms.Resize(8), transforms.CenterCrop(8), transforms.ToTensor(),
                                  transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    x, y = next(iter(DataLoader(datasets.ImageFolder(str(folder), transform=prepare), batch_size=4)))
    assert y.tolist() == [0, 0, 1, 1]  # cat, dog: sorted folder names
    torch.manual_seed(0)
    out = ConvNet()(x)
    assert steps.loss.iloc[0] == pytest.approx(F.cross_entropy(out, y).item(), rel=1e-5)
    assert steps.accuracy.iloc[0] == (out.argmax(1) == y).float().mean().item()


def test_an_image_folder_with_more_classes_than_the_model_is_refused(tmp_path):
    folder = _png_folder(tmp_path / "images", classes=("a", "b", "c"), per_class=1)
    with pytest.raises(ConfigError, match=r"^data.path: .* has 3 classes \(a, b, c\) but model.num_classes=2$"):
        compile_plan(make_config("model=custom", "model._target_=torch.nn.Linear", "+model.in_features=3",
                                 "+model.out_features=2", "model.num_classes=2", "data=imagefolder",
                                 f"data.path={folder}"))


def test_epochs_count_passes_over_the_data_and_config_yaml_keeps_what_was_given():
    digits = ("model=digits_cnn", "data=digits", "loss=cross_entropy")
    plan = compile_plan(make_config(*digits, "epochs=2"))
    assert plan.settings.steps == 2 * (1438 // 64)  # drop_last: 22 full batches of 64 training digits an epoch
    assert "steps: null" in plan.config_yaml and "epochs: 2" in plan.config_yaml
    assert compile_plan(make_config(*LABELLED, "epochs=3", "data.drop_last=true")).settings.steps == 3 * (40 // 8)
    plain = compile_plan(make_config(*digits))
    assert plain.settings.steps == 1 and "steps: 1" in plain.config_yaml and "epochs: null" in plain.config_yaml


@pytest.mark.parametrize("overrides, message", [
    (("data._target_=datasets_for_tests.not_a_dataset",),
     "data._target_: 'datasets_for_tests.not_a_dataset' is not a torch.utils.data.Dataset class, nor a function "
     "annotated to return one (-> Dataset); refused without calling it"),
    (("+data.kwargs.size=3",), "data.kwargs.size: unknown argument of 'datasets_for_tests.labelled' 'size'; "
                               "valid: classes, n"),
    (("epochs=2", "steps=3"), "epochs: 2 and steps: 3 both given; set one of them"),
    (("epochs=0",), "epochs: 0 must be at least 1"),
    (("data.held_out=1.0",), "data.held_out: 1.0 must be a fraction in [0, 1)"),
    (("data.held_out=0.01",), "data.held_out: 0.01 of 40 items leaves none"),
    (("data.batch_size=0",), "data.batch_size: 0 must be at least 1"),
    (("data.batch_size=64", "data.drop_last=true"), "data.batch_size: 64 is more than the 40 training items"),
    (("data.num_workers=-1",), "data.num_workers: -1 must be at least 0"),
    (("data.shape=[8,3,8,8]",), "data.shape: data=dataset takes its shape from the dataset's items"),
    (("+data.kwargs.n=0",), "data: the dataset dataset has no items"),
    (("model=mlp", "data._target_=datasets_for_tests.Stream", "data.shuffle=false", "epochs=1"),
     "epochs: data=dataset has no length to count epochs in; use steps=N"),
    (("model=mlp", "data._target_=datasets_for_tests.Stream"),
     "data.shuffle: an IterableDataset sets its own order; set data.shuffle=false"),
    (("model=mlp", "data._target_=datasets_for_tests.Stream", "data.shuffle=false", "data.held_out=0.5"),
     "data.held_out: an IterableDataset has no items to hold out"),
])
def test_dataset_mistakes_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        compile_plan(make_config(*LABELLED, *overrides))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1
