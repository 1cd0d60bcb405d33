"""The config schema: one dataclass per part of a run, registered in Hydra's ConfigStore.

Hydra merges every preset into its schema while it composes, so a misspelled key
(``hooks.clip.maxx=1``, ``+steps_=3``), a value of the wrong type (``steps=abc``) or outside an
enum (``mode=trian``) fails before anything runs, and presets in ``conf/`` carry only what
they change. The schemas of the choices are stored as each choice is registered
(``common.registry.Registry``): a hook preset inherits its type's spec (``@register("clamp")`` in
``hooks/`` stores ``hook_schema/clamp``), a data preset its kind's (``@DATA_KINDS.register("randn",
schema=SyntheticData)`` stores ``data_schema/randn``), and so for models and optimizers.

What a type cannot say (``min <= max``, a selector that matches a module, a shape that fits the
model) is checked once, by ``runner.engine.plan.compile_plan``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from hooks.specs.base import Answers


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Mode(str, Enum):
    train = "train"
    eval = "eval"
    generate = "generate"  #: eval mode, ``model.generate`` on each batch of prompts (``runner.engine.generation``)


#: What analysis answers for a mode's own rows, as a hook type declares its (``HookSpec.answers``): the run answers
#: as the pseudo-entry named by the mode (``runner.analysis.summary.entry_types``).
MODE_ANSWERS: dict[Mode, Answers] = {
    Mode.generate: Answers("runner.analysis.answers.generation:generation_answer",
                           "runner.analysis.answers.generation:generation_sweep_answer"),
}


class Policy(str, Enum):
    """What a run does about a problem it finds: stop, say so and go on, or say nothing."""

    error = "error"
    warn = "warn"
    ignore = "ignore"


@dataclass
class SampleConfig:
    """``every``: record every k-th step (from step 0); of activations, ``batch``: the first n
    samples, ``channels``: n random channels (dim 1, the same at every step)."""

    every: int = 1
    batch: Optional[int] = None
    channels: Optional[int] = None


@dataclass
class OutputConfig:
    row_group_mb: float = 64.0  #: what each parquet file buffers before writing a row group: bounds memory


@dataclass
class MemoryConfig:
    """``memory.budget=2GiB``: the most host memory the entries may hold; a plan that holds more is
    refused before the run (``runner.engine.budget``). Null: no bound."""

    budget: Optional[str] = None


@dataclass
class FsdpConfig:
    """``fsdp.enabled=true`` under torchrun: the model sharded with FSDP2 over the ranks (``runner.engine.fsdp``)."""

    enabled: bool = False
    #: the modules sharded on their own before the model (a selector: ``*`` the direct children, ``transformer.h.*``)
    blocks: list[str] = field(default_factory=lambda: ["*"])


@dataclass
class NamedModel:
    """A model by name (``runner.sources.models``: the tutorials' nets or any torchvision model)."""

    name: str = MISSING                 #: the model: a tutorial net or a torchvision model, by name
    weights: Optional[str] = None       #: torchvision's weights (``DEFAULT`` where it can download); null: random
    checkpoint: Optional[str] = None    #: a saved state dict loaded into the model; null: none
    input_shape: Optional[list[int]] = None  #: the input ``data.shape`` follows when null, batch first
    num_classes: Optional[int] = None   #: the output classes, where the model takes the number
    head: Optional[str] = None          #: the last Linear layer's name (``hooks=zero_bias`` and presets use it)
    input_kind: str = "tensor"          #: what the model takes: ``tensor`` (floats) or ``tokens`` (integer ids)


@dataclass
class HFModel(NamedModel):
    """A Hugging Face model saved in a local directory (``save_pretrained``), loaded offline."""

    name: str = "hf"
    path: str = MISSING                 #: the directory holding config.json and the weights
    auto: str = "causal_lm"             #: which Auto class loads it (``runner.sources.hf.AUTO_CLASSES``)
    input_kind: str = "tokens"
    device_map: Any = None              #: accelerate's placement: "auto", "cpu", or {module: device | "disk"}
    offload_folder: Optional[str] = None  #: where modules mapped to "disk" are kept


#: Keys of a model config that describe the run around the model. A ``_target_`` model (which has
#: no schema: its other keys are its constructor's arguments) takes these too.
MODEL_RUN_KEYS = tuple(f.name for f in dataclasses.fields(NamedModel))


@dataclass
class DataBase:
    kind: str = MISSING                 #: the data kind (``runner.config.registry.DATA_KINDS``)
    shape: Optional[list[int]] = None   #: null follows model.input_shape
    requires_grad: bool = False         #: true makes the input a leaf with a gradient
    targets: Any = None                 #: class targets: an int, a list, or null
    seed: int = 0                       #: added to the run's seed for the data only: other batches, same model


@dataclass
class ShardConfig:
    """Data kinds with a length: a whole-dataset pass (mode=eval) covers only part ``shard`` of
    ``num_shards`` contiguous parts (``runner.engine.whole_pass``); sample ids stay the dataset's."""

    shard: int = 0                     #: which part this job covers, from 0
    num_shards: int = 1                #: how many contiguous parts the dataset is split into


@dataclass
class SyntheticData(DataBase):
    """``ones`` (the tutorials' dummy input) or ``randn`` (seeded, a new batch each step)."""


@dataclass
class TokenData(ShardConfig, DataBase):
    kind: str = "tokens"
    size: Optional[int] = None          #: null: new random ids each step; N: N fixed sequences (seeded by data.seed)


@dataclass
class FakeImages(DataBase):
    kind: str = "fake"
    size: int = 1000                    #: images in the dataset; batches cycle through it
    num_classes: Optional[int] = None   #: null follows model.num_classes


@dataclass
class ImageFiles(DataBase):
    kind: str = "image"
    path: Optional[str] = None          #: required: a file or a folder of images
    resize: int = 256                  #: the shorter side is resized to this many pixels
    crop: int = 224                    #: then the centre square of this side is cut
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])  #: per channel, subtracted
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])  #: per channel, divided by


@dataclass
class DigitsData(ShardConfig, DataBase):
    """scikit-learn's 1,797 labelled 8x8 digits (shipped in the package): seeded train/held-out parts."""

    kind: str = "digits"
    batch_size: int = 64               #: training batches, reshuffled each epoch from the run's seed
    held_out: float = 0.2              #: fraction kept apart; eval passes use all of it as one batch
    split_seed: int = 0                #: which digits are held out: the same for every run seed


@dataclass
class LoaderConfig(ShardConfig):
    """How a ``Dataset`` is batched (``torch.utils.data.DataLoader``) and which part is held out."""

    batch_size: int = 32               #: items per batch
    shuffle: bool = True               #: a new order each epoch, drawn from the run's seed
    num_workers: int = 0               #: the DataLoader's worker processes (0: load in the run's process)
    drop_last: bool = False            #: drop a last batch smaller than batch_size
    held_out: float = 0.0              #: fraction kept apart for eval passes (0: they draw training batches)
    split_seed: int = 0                #: which items are held out: the same for every run seed


@dataclass
class DatasetData(LoaderConfig, DataBase):
    """Any ``torch.utils.data.Dataset``: ``_target_`` names its class or a function returning one."""

    kind: str = "dataset"
    _target_: str = MISSING            #: the dotted path of the Dataset class or of a function returning one
    kwargs: dict[str, Any] = field(default_factory=dict)  #: the arguments ``_target_`` is called with


@dataclass
class ImageFolderData(LoaderConfig, ImageFiles):
    """torchvision's ``ImageFolder`` at ``path``: one subfolder per class, the ImageNet transforms."""

    kind: str = "imagefolder"


@dataclass
class TextData(ShardConfig, DataBase):
    """Prompts (``prompts``, or ``path``: a file of one prompt per line) tokenized by the
    ``save_pretrained`` tokenizer in ``tokenizer`` (null: ``model.path`` of ``model=hf``), padded on
    the right to the longest prompt (``runner.sources.text``); each prompt is named by its text."""

    kind: str = "text"
    prompts: list[str] = field(default_factory=list)  #: the prompts, or give ``path``
    path: Optional[str] = None          #: a UTF-8 file of one prompt per line (blank lines skipped)
    tokenizer: Optional[str] = None     #: a save_pretrained tokenizer folder; null: ``model.path`` of model=hf
    batch_size: Optional[int] = None    #: prompts per batch; null: all of them in one


@dataclass
class GenerateConfig:
    """``mode=generate``: ``model.generate`` on each batch of prompts with the run's hooks attached
    (``runner.engine.generation``). Greedy unless ``do_sample``; a sampled batch k is drawn after
    ``torch.manual_seed(seed + k)``; ``top_k: 0`` keeps every token. ``use_cache``: each call after the
    first sees only the new position (false: every call sees the whole sequence so far)."""

    max_new_tokens: int = 20            #: tokens generated per prompt (fewer where the model ends the text)
    do_sample: bool = False             #: greedy (false) or sampled
    seed: int = 0                       #: a sampled batch k is drawn after torch.manual_seed(seed + k)
    temperature: float = 1.0            #: sampled only
    top_k: int = 0                      #: sampled only; 0 keeps every token
    use_cache: bool = True              #: the key/value cache: later calls see only the new position


@dataclass
class LossConfig:
    name: str = "sum"
    target_class: Optional[int] = None  #: class_score only: a class index, or null for the top class
    _module_: Optional[str] = None      #: the module registering a loss of your own (``runner.config.registry``)


@dataclass
class MetricConfig:
    """What interventions are judged by, per step in ``steps.parquet`` (batch means; token models
    read the last position): ``logit`` of class ``target``, ``logit_diff`` = logit of ``diff[0]``
    minus logit of ``diff[1]`` (classes or token ids). Null: the column stays NaN. ``measures``
    names registered measures (``METRICS``; null: every one whose options are set), ``_module_``
    the module registering one of your own."""

    target: Optional[int] = None
    diff: Optional[list[int]] = None
    measures: Optional[list[str]] = None
    _module_: Optional[str] = None


@dataclass
class NoOptimizer:
    name: str = "none"                 #: no optimizer: the parameters stay as they are


@dataclass
class SGDConfig:
    name: str = "sgd"                  #: ``torch.optim.SGD``
    lr: float = 0.01                   #: learning rate
    momentum: float = 0.0              #: momentum factor
    weight_decay: float = 0.0          #: L2 penalty
    nesterov: bool = False             #: Nesterov momentum


@dataclass
class AdamConfig:
    name: str = "adam"                 #: ``torch.optim.Adam``
    lr: float = 1e-3                   #: learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  #: running averages' coefficients
    eps: float = 1e-8                  #: added to the denominator
    weight_decay: float = 0.0          #: L2 penalty


@dataclass
class RunConfig:
    """Every setting of a run; ``conf/config.yaml`` picks the presets of each group."""

    seed: int = 0                     #: seeds torch (model init) and the data generator
    device: Device = Device.auto
    steps: Optional[int] = None       #: forward/backward passes; each step writes its own rows (null: 1)
    epochs: Optional[int] = None      #: instead of steps: passes over a dataset with a length
    mode: Mode = Mode.train           #: the model's mode (BatchNorm and Dropout behave differently)
    on_nonfinite: Policy = Policy.warn
    on_silent: Policy = Policy.warn   #: an entry that matched but recorded or changed nothing
    overwrite: bool = False
    #: a sweep: false, true (continue the sweep in hydra.sweep.dir), failed (and rerun its failed jobs)
    resume: Any = False
    plan: bool = False
    plots: list[str] = field(default_factory=list)  #: names in ``runner.config.registry.PLOTS``
    eval_every: int = 0
    eval_steps: int = 1
    progress: bool = True
    quiet: bool = False               #: no summary printed when a run or sweep ends
    compile: bool = False
    stop_after: Optional[str] = None  #: end each forward after this module (auto: nn.Sequential); loss=none
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)  #: mode=generate's settings
    output: OutputConfig = field(default_factory=OutputConfig)
    model: Any = MISSING
    data: Any = MISSING
    loss: LossConfig = field(default_factory=LossConfig)
    metric: MetricConfig = field(default_factory=MetricConfig)
    optimizer: Any = MISSING
    hooks: dict[str, Any] = field(default_factory=dict)
    logger: dict[str, Any] = field(default_factory=dict)  #: live loggers by name (``runner.live``; ``logger=[tensorboard,wandb]``)


def register_schemas() -> None:
    """Store the run's schema in Hydra's ConfigStore (idempotent: storing again replaces); the
    registries store their choices' schemas as they are registered."""
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    store.store(group="model_schema", name="named", node=NamedModel)


register_schemas()
