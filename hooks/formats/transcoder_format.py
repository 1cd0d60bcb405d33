"""Transcoders read from disk: SAELens 6's transcoder folders and circuit-tracer 0.5's per-layer files, with
each library's own encode, decode and skip term, and the contract every transcoder the ``transcoder`` hook
type splices keeps.

The contract (``check_transcoder``): an object with ``encode(x) -> features`` (``[..., d_in]`` to
``[..., d_sae]``), ``decode(features)`` (``[..., d_out]``, the decoder bias included), ``W_dec``
``[d_sae, d_out]`` and ``W_enc`` (either orientation), and, for a skip transcoder, ``W_skip`` ``[d_out, d_in]``:
the skip term is ``x @ W_skip.T``. SAELens's ``Transcoder``/``SkipTranscoder`` and circuit-tracer's
``SingleLayerTranscoder`` keep it.

SAELens (``sae_lens.saes.transcoder``, ``save_model``): a folder with ``cfg.json`` (``architecture``
``transcoder``, ``skip_transcoder``, ``jumprelu_transcoder`` or ``jumprelu_skip_transcoder``; ``d_in``,
``d_sae``, ``d_out``) and ``sae_weights.safetensors``: ``W_enc`` ``[d_in, d_sae]``, ``b_enc``, ``W_dec``
``[d_sae, d_out]``, ``b_dec`` ``[d_out]``, ``W_skip`` ``[d_out, d_in]`` (skip), ``threshold`` (jumprelu).
Encode is ``relu(x W_enc + b_enc)``, for jumprelu zeroed where the pre-activation is not above ``threshold``;
no ``b_dec`` on the way in (SAELens refuses ``apply_b_dec_to_input`` for transcoders).

circuit-tracer (``SingleLayerTranscoder.to_safetensors``, read by ``load_relu_transcoder``): a folder of
``layer_<i>.safetensors``, one per block, each holding ``W_enc`` ``[d_sae, d_model]``, ``b_enc``, ``W_dec``
``[d_sae, d_model]``, ``b_dec``, optionally ``W_skip`` ``[d_model, d_model]`` and
``activation_function.threshold`` (its JumpReLU: ``pre * (pre > threshold)``, without a ReLU); the folder's
``config.yaml`` names the points the features read and write (``feature_input_hook``, ``feature_output_hook``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open

from common.errors import ConfigError, choice_error
from hooks.formats.sae_format import CONFIG_FILE, WEIGHTS_FILE, SaeLensSae, read_mapping

#: SAELens 6's transcoder architectures (``cfg.json``'s ``architecture``).
ARCHITECTURES = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
#: The shapes of a SAELens transcoder's tensors, by the config's dims.
SHAPES = {"W_enc": ("d_in", "d_sae"), "b_enc": ("d_sae",), "W_dec": ("d_sae", "d_out"), "b_dec": ("d_out",)}
#: circuit-tracer's per-layer files and folder config.
LAYER_FILE = re.compile(r"layer_(\d+)\.safetensors")
CT_CONFIG = "config.yaml"
CT_THRESHOLD = "activation_function.threshold"
#: circuit-tracer's (TransformerLens's) names of the points an MLP transcoder reads and writes: the MLP's input
#: (after the block's second norm) and its output, which is where the ``transcoder`` entry splices.
CT_INPUTS = ("mlp.hook_in", "ln2.hook_normalized")
CT_OUTPUTS = ("hook_mlp_out", "mlp.hook_out")


class LoadedTranscoder(SaeLensSae):
    """One transcoder for inference, in float tensors of its file's dtype: ``W_enc`` held ``[d_in, d_sae]``
    whichever way its file held it; decoded as a SAELens SAE without normalization decodes (``f W_dec + b_dec``).
    ``jump``: ``"saelens"`` (``relu(pre) * (pre > threshold)``), ``"circuit_tracer"`` (``pre * (pre >
    threshold)``) or ``None`` (ReLU)."""

    def __init__(self, tensors: dict[str, torch.Tensor], jump: str | None) -> None:
        super().__init__(tensors, {"architecture": "standard", "apply_b_dec_to_input": False,
                                   "normalize_activations": "none"})
        self.jump = jump

    @property
    def W_enc(self) -> torch.Tensor:  # noqa: N802 - the libraries' names, which the contract reads
        return self.tensors["W_enc"]

    @property
    def W_skip(self) -> torch.Tensor | None:  # noqa: N802
        return self.tensors.get("W_skip")

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        w = self._at(x.device)
        pre = x.to(w["W_enc"].dtype) @ w["W_enc"] + w["b_enc"]
        if self.jump is None:
            return torch.relu(pre)
        above = (pre > w["threshold"]).to(pre.dtype)
        return (torch.relu(pre) if self.jump == "saelens" else pre) * above


def read_saelens_config(path: Path, key: str) -> dict[str, Any]:
    """A SAELens transcoder folder's ``cfg.json``, checked: a transcoder architecture (an SAE's folder, which
    has no output point, is refused naming ``hooks=sae``), ``d_in``/``d_sae``/``d_out``, no normalization."""
    cfg = read_mapping(path / CONFIG_FILE, key)
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES and "d_out" not in cfg:
        raise ConfigError(f"{key}: the folder '{path}' holds an SAE (architecture '{architecture}'), which has no "
                          f"output point (no d_out): a transcoder reads one point and writes another; splice an "
                          f"SAE with hooks=sae, or give a transcoder ({', '.join(ARCHITECTURES)})")
    if architecture not in ARCHITECTURES:
        raise choice_error(f"{key}: '{path / CONFIG_FILE}'", architecture, ARCHITECTURES, "architecture")
    for name in ("d_in", "d_sae", "d_out"):
        if not isinstance(cfg.get(name), int) or cfg[name] < 1:
            raise ConfigError(f"{key}: '{path / CONFIG_FILE}' has {name}={cfg.get(name)!r}; a positive integer")
    if cfg.get("normalize_activations", "none") != "none":
        raise ConfigError(f"{key}: the transcoder at '{path}' has normalize_activations "
                          f"'{cfg['normalize_activations']}'; supported: none")
    return cfg


def saelens_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(cfg[dim] for dim in dims) for name, dims in SHAPES.items()}
    if "skip" in cfg["architecture"]:
        shapes["W_skip"] = (cfg["d_out"], cfg["d_in"])
    if cfg["architecture"].startswith("jumprelu"):
        shapes["threshold"] = (cfg["d_sae"],)
    return shapes


def header_shapes(file: Path, key: str) -> dict[str, tuple[int, ...]]:
    """The tensors of a safetensors file and their shapes, from its header alone."""
    try:
        with safe_open(file, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a broken file
        raise ConfigError(f"{key}: '{file}' is not a readable safetensors file: {exc}") from None


def check_tensors(file: Path, found: dict, wanted: dict, what: str, key: str) -> None:
    """Refuse a file whose tensors are not exactly ``wanted`` in their shapes: one line naming the first."""
    for name in sorted(found.keys() | wanted.keys()):
        if name not in found:
            raise ConfigError(f"{key}: '{file}' has no tensor '{name}' ({what} has {', '.join(wanted)})")
        if name not in wanted:
            raise ConfigError(f"{key}: '{file}' holds '{name}', which {what} does not have ({', '.join(wanted)})")
        if found[name] != wanted[name]:
            raise ConfigError(f"{key}: '{file}' holds '{name}' of shape {list(found[name])}; {what} makes it "
                              f"{list(wanted[name])}")


def circuit_tracer_shapes(found: dict[str, tuple[int, ...]], file: Path, key: str) -> dict[str, tuple[int, ...]]:
    """The shapes a circuit-tracer layer file's tensors must have, from its ``b_enc`` and ``b_dec``."""
    if len(found.get("b_enc", ())) != 1 or len(found.get("b_dec", ())) != 1:
        raise ConfigError(f"{key}: '{file}' has no 1-d 'b_enc' and 'b_dec'; a circuit-tracer transcoder holds W_enc, "
                          f"b_enc, W_dec, b_dec (and W_skip, {CT_THRESHOLD})")
    (d_sae,), (d_model,) = found["b_enc"], found["b_dec"]
    wanted = {"W_enc": (d_sae, d_model), "b_enc": (d_sae,), "W_dec": (d_sae, d_model), "b_dec": (d_model,)}
    if "W_skip" in found:
        wanted["W_skip"] = (d_model, d_model)
    if CT_THRESHOLD in found:
        wanted[CT_THRESHOLD] = (d_sae,)
    return wanted


def circuit_tracer_layers(path: Path, key: str) -> dict[int, Path]:
    """The per-layer files of a circuit-tracer folder (block -> file), its ``config.yaml`` checked: the
    features read the MLP's input and write its output, the points a ``transcoder`` entry splices."""
    files = {int(m.group(1)): path / m.group(0) for f in sorted(path.iterdir()) if (m := LAYER_FILE.fullmatch(f.name))}
    config = path / CT_CONFIG
    if config.is_file():
        try:
            points = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{key}: '{config}' is not readable YAML: {exc}") from None
        if not isinstance(points, dict):
            raise ConfigError(f"{key}: '{config}' holds {type(points).__name__}, not a mapping")
        for point, known in (("feature_input_hook", CT_INPUTS), ("feature_output_hook", CT_OUTPUTS)):
            if point not in points:
                raise ConfigError(f"{key}: '{config}' names no {point}: a transcoder without "
                                  f"{'an input' if 'input' in point else 'an output'} point; an MLP transcoder has "
                                  f"{point}: {known[0]}")
            if points[point] not in known:
                raise choice_error(f"{key}: '{config}' has {point}", points[point], known, "point")
    return files


def check_folder(folder: str, key: str) -> dict[str, Any]:
    """What the transcoder folder ``folder`` holds, checked from headers: ``{"format": "saelens", "cfg": ...,
    "dims": (d_in, d_sae, d_out)}`` or ``{"format": "circuit_tracer", "layers": {block: file}, "dims": {block:
    (d_in, d_sae, d_out)}}``; anything else is one line."""
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(f"{key}: no folder at '{path}'; a transcoder is a SAELens folder ({CONFIG_FILE}, "
                          f"{WEIGHTS_FILE}) or a circuit-tracer folder (layer_<i>.safetensors)")
    if (path / CONFIG_FILE).is_file():
        cfg = read_saelens_config(path, key)
        if not (path / WEIGHTS_FILE).is_file():
            raise ConfigError(f"{key}: '{path}' has no {WEIGHTS_FILE}")
        what = f"a {cfg['architecture']} with d_in={cfg['d_in']}, d_sae={cfg['d_sae']}, d_out={cfg['d_out']}"
        check_tensors(path / WEIGHTS_FILE, header_shapes(path / WEIGHTS_FILE, key), saelens_shapes(cfg), what, key)
        return {"format": "saelens", "cfg": cfg, "dims": (cfg["d_in"], cfg["d_sae"], cfg["d_out"])}
    layers = circuit_tracer_layers(path, key)
    if not layers:
        raise ConfigError(f"{key}: '{path}' holds neither {CONFIG_FILE} (SAELens) nor layer_<i>.safetensors "
                          f"(circuit-tracer); other formats: a loader in {key.rsplit('.', 1)[0]}._target_")
    dims = {}
    for block, file in layers.items():
        found = header_shapes(file, key)
        check_tensors(file, found, circuit_tracer_shapes(found, file, key), "a circuit-tracer transcoder", key)
        (d_sae,), (d_model,) = found["b_enc"], found["b_dec"]
        dims[block] = (d_model, d_sae, d_model)
    return {"format": "circuit_tracer", "layers": layers, "dims": dims}


def load_saelens_transcoder(folder: str, cfg: dict[str, Any]) -> LoadedTranscoder:
    """The SAELens transcoder in ``folder`` (``cfg``: its ``cfg.json`` as ``check_folder`` read it), in its dtype."""
    dtype = getattr(torch, str(cfg.get("dtype", "float32")).removeprefix("torch."))
    with safe_open(Path(folder) / WEIGHTS_FILE, framework="pt") as f:
        tensors = {name: f.get_tensor(name).to(dtype) for name in f.keys()}  # noqa: SIM118
    return LoadedTranscoder(tensors, "saelens" if cfg["architecture"].startswith("jumprelu") else None)


def load_circuit_tracer_layer(file: str) -> LoadedTranscoder:
    """One circuit-tracer layer file, as ``load_relu_transcoder`` reads it (``W_enc`` turned ``[d_in, d_sae]``)."""
    with safe_open(file, framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    tensors["W_enc"] = tensors["W_enc"].T.contiguous()
    threshold = tensors.pop(CT_THRESHOLD, None)
    if threshold is not None:
        tensors["threshold"] = threshold
    return LoadedTranscoder(tensors, None if threshold is None else "circuit_tracer")


def check_transcoder(tc: Any, key: str) -> tuple[int, int, int]:
    """``(d_in, d_sae, d_out)`` of a loaded transcoder keeping the contract (module docstring), else one line."""
    missing = [name for name in ("encode", "decode") if not callable(getattr(tc, name, None))]
    w_dec, w_enc, w_skip = (getattr(tc, name, None) for name in ("W_dec", "W_enc", "W_skip"))
    for name, w in (("W_dec [d_sae, d_out]", w_dec), ("W_enc", w_enc)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            missing.append(name)
    if missing:
        raise ConfigError(f"{key}: the loader returned a {type(tc).__name__} without {', '.join(missing)}; a "
                          f"transcoder has encode(x), decode(features), W_enc, W_dec [d_sae, d_out] (and W_skip "
                          f"[d_out, d_in] for a skip transcoder)")
    d_sae, d_out = w_dec.shape
    d_in = w_enc.shape[1] if w_enc.shape[0] == d_sae else w_enc.shape[0]
    if w_skip is not None and (not isinstance(w_skip, torch.Tensor) or tuple(w_skip.shape) != (d_out, d_in)):
        raise ConfigError(f"{key}: the loader's W_skip is {getattr(w_skip, 'shape', w_skip)}; a skip term maps "
                          f"d_in={d_in} to d_out={d_out}: W_skip [d_out, d_in]")
    return int(d_in), int(d_sae), int(d_out)


def load_transcoder(path: str, cfg: dict[str, Any] | None = None) -> LoadedTranscoder:
    """The default loader: a SAELens transcoder folder, or one circuit-tracer layer file; ``cfg``: what
    ``check_folder`` read of the entry's folder."""
    if Path(path).is_file():
        return load_circuit_tracer_layer(path)
    cfg = check_folder(path, "transcoder.path") if cfg is None else cfg
    return load_saelens_transcoder(path, cfg["cfg"])
