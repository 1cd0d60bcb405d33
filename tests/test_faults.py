"""The fault suite: bad input, faults and interruptions, each through the CLI's ``execute``.

Every case asserts the one-line message, the exit status, that every hook dict of the model and
the global hook dicts are exactly as before the run (the ``watch`` fixture, which also keeps a
hook of the user's own that must survive), and that no parquet, manifest or temporary file is
left. Signals go to the real CLI in a subprocess, by pid.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from conftest import assert_no_partial_output, make_config, run, sigint_as_at_a_terminal
from common.errors import ConfigError
from hooks.mechanism.recorder import Recorder
from runner.cli.execute import execute
from runner.sources.models import ConvNet

ROOT = Path(__file__).resolve().parents[1]


CONFIG_ERRORS = [
    (["hooks=clip", "hooks.clip.type=clmap"], "hooks.clip.type: unknown hook type 'clmap'; valid: "),
    (["hooks=clip", "+hooks.clip.maxx=1"], ("hooks.clip.maxx: unknown key", "'maxx'; valid: ", "did you mean 'max'?")),
    (["hooks=clip", "hooks.clip.max=big"], "hooks.clip.max: 'big' is not a number"),
    (["hooks=clip", "hooks.clip.min=1", "hooks.clip.max=0"], "hooks.clip: min (1.0) > max (0.0); swap them"),
    (["hooks=clip", "hooks.clip.min=null", "hooks.clip.max=null"], "hooks.clip: set min, max or both"),
    (["hooks=clip", "hooks.clip.min=nan"], "hooks.clip.min: NaN is not a bound"),
    (["hooks=clip", "hooks.clip.target=outputs"],
     "hooks.clip.target: unknown target 'outputs'; valid: input, output, params; did you mean 'output'?"),
    (["hooks=clip", "hooks.clip.target=output", "+hooks.clip.params=[bias]"],
     "hooks.clip.params: only meaningful with target=params"),
    (["hooks=clip", "+hooks.clip.params=[]"], "hooks.clip.params: empty list"),
    (["hooks=zero_bias", "hooks.zero_bias.params=[bais]"],
     ("hooks.zero_bias.params: unknown parameter", "'bais'; valid: bias, weight; did you mean 'bias'?")),
    (["hooks=clip", "hooks.clip.layers=relu"], "hooks.clip.layers: the selected modules have no trainable parameters"),
    (["hooks=stats", "hooks.stats.kinds=[outputs]"], "hooks.stats.kinds: unknown kind 'outputs'"),
    (["hooks=stats", "hooks.stats.kinds=[]"], "hooks.stats.kinds: empty"),
    (["hooks=shift", "hooks.shift.op=sub"], "hooks.shift.op: unknown op 'sub'; valid: add, mul, set"),
    (["hooks=shift", "hooks.shift.value=nan"], "hooks.shift.value: NaN"),
    (["hooks=extract"], "hooks.extract.layers: 'layer4' matches no module"),
    (["model=resnet18", "hooks=extract", "hooks.extract.layers=[layer4,avgpol]"],
     "'avgpol' matches no module; did you mean 'avgpool'"),
    (["hooks=clip", "hooks.clip.layers=[]"], "hooks.clip.layers: empty selector"),
    (["hooks=stats", "hooks.stats.layers='re:conv('"], "hooks.stats.layers: invalid regular expression 're:conv('"),
    (["hooks=stats", "hooks.stats.layers=type:Conv3d"],
     "hooks.stats.layers: no module of class 'Conv3d'; classes in this model: Conv2d, ConvNet, Flatten, Linear, ReLU; "
     "did you mean 'type:Conv2d'?"),
    (["hooks=stats", "hooks.stats.layers=leaf:"], "hooks.stats.layers: 'leaf:' matched modules but none of them is a leaf"),
    (["hooks=clip", "loss=none"], "hooks.clip: 'clamp' needs a backward pass but loss=none"),
    (["hooks=stats", "loss=none"], "hooks.stats: 'stats' needs a backward pass but loss=none"),
    (["hooks=[clip,clip]"], "hooks: preset 'clip' is listed twice in hooks=[clip,clip]"),
    (["hooks=patch", "hooks.patch.source=clean", "hooks.patch.layers=conv", "eval_every=1"],
     "hooks.patch: 'patch' patches in values recorded for each training step's batch, which held-out eval batches "
     "do not have; set eval_every=0 or drop the entry"),
    (["+typo=1"], ("typo: unknown setting 'typo'; valid: ", "data, device, epochs, eval_every, ", "seed, steps")),
    (["+stpes=3"], "stpes: unknown setting 'stpes'; valid: "),
    (["+model.widht=3"], ("model.widht: unknown key for model 'convnet' 'widht'; valid: checkpoint, head, ",
                          "name, num_classes, weights")),
    (["+data.shufle=true"], "data.shufle: unknown key for data kind 'randn' 'shufle'; valid: kind, requires_grad, "
                            "seed, shape, targets"),
    (["+loss.reduction=sum"], "loss.reduction: unknown key for loss 'reduction'; valid: _module_, name, target_class"),
    (["data.kind=gauss"], "data.kind: unknown data kind 'gauss'; valid: dataset, digits, fake, image, imagefolder, "
                          "ones, randn, text, tokens"),
    (["data.shape=[-2,3,8,8]"], "data.shape: [-2, 3, 8, 8] must be a list of positive integers"),
    (["data.shape=[nan,3]"], "data.shape[0]: nan is not an integer"),
    (["data.shape=[0,3]"], "data.shape: [0, 3] must be a list of positive integers"),
    (["loss=cross_entropy", "data.targets=7"],
     "data.targets: 7 is not a class of a model with num_classes=5; use integers in [0, 4]"),
    (["steps=0"], "steps: 0 must be at least 1"),
    (["steps=-3"], "steps: -3 must be at least 1"),
    (["steps=1.5"], "steps: 1.5 is not an integer"),
    (["seed=abc"], "seed: 'abc' is not an integer"),
    (["mode=training"], "mode: unknown mode 'training'; valid: eval, generate, train; did you mean 'train'?"),
    (["device=tpu"], "device: unknown device 'tpu'; valid: auto, cpu, cuda"),
    (["on_nonfinite=eror"], "on_nonfinite: unknown policy 'eror'; valid: error, ignore, warn; did you mean 'error'?"),
    (["overwrite=maybe"], "overwrite: 'maybe' must be true or false"),
    (["loss.name=crossentropy"], "loss.name: unknown loss 'crossentropy'; valid: "),
    (["model.name=resnet19"], "model.name: unknown model 'resnet19'; valid: "),
    (["model=custom"], "model._target_: required for model=custom"),
    (["model=custom", "model._target_=nowhere.Net"], "model._target_: cannot import 'nowhere.Net': no module named 'nowhere'"),
    (["model.checkpoint=/nonexistent.pt"], "model.checkpoint: no file at '/nonexistent.pt'"),
    (["data=image"], "data.path: required for data=image"),
    (["data=image", "data.path=/nonexistent/cat.jpg"], "data.path: no file or folder at '/nonexistent/cat.jpg'"),
    (["data=dataset"], "data._target_: required for data=dataset, e.g. data._target_=mypkg.make_dataset"),
    (["data=dataset", "data._target_=builtins.open"],
     "data._target_: 'builtins.open' is not a torch.utils.data.Dataset class, nor a function annotated to return "
     "one (-> Dataset); refused without calling it"),
    (["data=dataset", "data._target_=datasets_for_tests.labelled", "+data.batchsize=8"],
     ("data.batchsize: unknown key for data kind 'dataset' 'batchsize'", "did you mean 'batch_size'?")),
    (["data=dataset", "data._target_=datasets_for_tests.labelled", "epochs=2", "steps=3"],
     "epochs: 2 and steps: 3 both given; set one of them"),
    (["data=imagefolder"], "data.path: required for data=imagefolder"),
    (["data=imagefolder", "data.path=/nonexistent/images"], "data.path: no folder at '/nonexistent/images'"),
    (["model=hf", "data=tokens"], "model.path: required for model=hf"),
    (["model=hf", "data=tokens", "model.path=/nonexistent/gpt2"], "model.path: no directory at '/nonexistent/gpt2'"),
    (["model.checkpoint=/nonexistent.safetensors"], "model.checkpoint: no file at '/nonexistent.safetensors'"),
    # Hydra-level mistakes: one line, the closest option, never "use +"
    (["hooks=clp"], ("hooks: unknown preset 'clp'; valid: ", "did you mean 'clip'?")),
    (["model=resnet19"], ("model: unknown preset 'resnet19'; valid: ", "did you mean 'resnet18'?")),
    (["hooks=clip", "hooks.clip.maxx=1"], ("hooks.clip.maxx: unknown key of hooks.clip 'maxx'", "did you mean 'max'?")),
    (["step=3"], ("step: unknown setting 'step'; valid: ", "did you mean 'steps'?")),
    (["hooks.clip.max=0.1"], "hooks.clip.max: there is no entry hooks.clip in this config; add the preset: hooks=clip"),
    (["hooks=[clip,stats"], "cannot parse 'hooks=[clip,stats'"),
    (["data.shape=8"], "data.shape: 8 must be a list"),
    (["plots=[gradflow]"], "plots[0]: unknown plot 'gradflow'; valid: attribution_graph, feature_maps, grad_cam, gradient_flow, logit_lens"),
    (["hooks=stats", "hooks.stats.layers=${model.nope}"], "hooks.stats.layers: Interpolation key 'model.nope' not found"),
    (["hooks=patch", "hooks.patch.layers=conv", "hooks.patch.source=clean", "hooks.patch.clean.seed=3"],
     "hooks.patch.clean.seed: hooks.patch.clean is null, so it has no 'seed' to set; give the mapping whole: "
     "'hooks.patch.clean={seed: 3}'"),
    # an output edit on a module that returns several tensors needs the one: refused in the rehearsal
    (["model=custom", "model._target_=torch.nn.LSTM", "+model.input_size=4", "+model.hidden_size=3",
      "data.shape=[2,5,4]", "hooks=ablate", "hooks.ablate.layers=''"],
     "hooks.ablate: '(model)' returns a tuple with tensors at 0, 1.0, 1.1, and 'ablate' changes one of them: "
     "set hooks.ablate.slot"),
    (["model=custom", "model._target_=torch.nn.LSTM", "+model.input_size=4", "+model.hidden_size=3",
      "data.shape=[2,5,4]", "hooks=ablate", "hooks.ablate.layers=''", "hooks.ablate.slot=1.2"],
     "hooks.ablate.slot: unknown output slot of '(model)' '1.2'; valid: 0, 1.0, 1.1; did you mean"),
    # an edit naming an input the call does not have: one line, not an edit that does nothing
    (["hooks=shift", "hooks.shift.slot=3"], "hooks.shift.slot: unknown input slot of '(model)' '3'; valid: 0"),
    (["hooks=shift", "hooks.shift.kwarg=mask"], "hooks.shift.kwarg: unknown input slot of '(model)' 'mask'; valid: 0"),
    (["hooks=ablate", "hooks.ablate.layers=conv", "hooks.ablate.target=input", "hooks.ablate.slot=1"],
     "hooks.ablate.slot: unknown input slot of 'conv' '1'; valid: 0"),
    (["hooks=double_grad", "hooks.double_grad.target=input", "hooks.double_grad.layers=conv",
      "hooks.double_grad.slot=x"], "hooks.double_grad.slot: unknown input slot of 'conv' 'x'; valid: 0"),
    (["hooks=ablate", "hooks.ablate.layers=conv", "hooks.ablate.slot=[0]"],
     "hooks.ablate.slot: [0] must be a slot such as 0, 1.0 or a key of the output"),
    # shapes the model cannot take, found by the meta rehearsal
    (["data.shape=[1,3,16,16]"], "data.shape: [1, 3, 16, 16] does not fit the model: module 'fc' (Linear) failed on it"),
    (["model=resnet18", "data.shape=[1,1,32,32]"],
     "data.shape: [1, 1, 32, 32] does not fit the model: module 'conv1' (Conv2d) failed on it"),
    # targets that build no model are refused without being called
    (["model=custom", "model._target_=torch.nn.Lineer"], "model._target_: 'torch.nn' has no 'Lineer'"),
    (["model=custom", "model._target_=torch.nn.Linear", "+model.in_featrues=3", "+model.out_features=3"],
     ("model.in_featrues: unknown argument of 'torch.nn.Linear' 'in_featrues'", "did you mean 'in_features'?")),
]


@pytest.mark.parametrize("overrides, message", CONFIG_ERRORS, ids=[" ".join(o) for o, _ in CONFIG_ERRORS])
def test_bad_config_is_one_line_exit_2_before_any_forward_pass(fault, overrides, message):
    outcome = fault(*overrides)
    assert outcome.code == 2
    assert outcome.stderr.startswith("error: ")
    for part in (message,) if isinstance(message, str) else message:
        assert part in outcome.stderr


@pytest.mark.parametrize("loss", ["cross_entropy", "class_score"])
def test_a_loss_that_does_not_fit_the_output_is_one_line_where_the_rehearsal_cannot_run(fault, loss):
    """GPT-2's attention mask calls ``.item()``, so the meta rehearsal cannot run it: the first real
    forward finds the mistake, and it is still one line, status 2, nothing written."""
    outcome = fault("model=gpt2_tiny", "data=tokens", f"loss={loss}", forwards=1)
    assert outcome.code == 2
    assert outcome.stderr == (f"error: loss={loss}: the model output has shape [2, 16, 100], not [batch, classes] "
                              "(one class per sample); use loss=sum, mean or none")


@pytest.mark.parametrize("target, arguments", [
    ("builtins.open", ["+model.file={file}", "+model.mode=w"]),
    ("pathlib.Path.touch", ["+model.self={file}"]),
    ("os.makedirs", ["+model.name={dir}"]),
    ("torch.save", ["+model.obj=1", "+model.f={file}"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_target_that_builds_no_model_is_refused_without_running(fault, tmp_path, target, arguments):
    victim, new_dir = tmp_path / "precious.txt", tmp_path / "made"
    victim.write_text("keep me")
    args = [a.format(file=victim, dir=new_dir) for a in arguments]
    outcome = fault("model=custom", f"model._target_={target}", "data.shape=[2,3]", *args)
    assert outcome.code == 2
    assert outcome.stderr.startswith(f"error: model._target_: '{target}' is not an nn.Module class")
    assert victim.read_text() == "keep me" and not new_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_ctrl_c_in_the_model_exits_130(fault):
    outcome = fault("model=custom", "model._target_=models_for_tests.Interrupted", "data.shape=[2,3]",
                    "hooks=stats", "hooks.stats.layers=**", forwards=1)
    assert outcome.code == 130
    assert outcome.stderr.startswith("error: interrupted; nothing of this run was written to ")


def test_sigterm_in_the_model_exits_143_and_restores_the_default_handler(fault):
    before = signal.getsignal(signal.SIGTERM)
    outcome = fault("model=custom", "model._target_=models_for_tests.SelfTerminated", "data.shape=[2,3]",
                    "hooks=[stats,clip]", "hooks.stats.layers=**", "hooks.clip.layers=fc", forwards=1)
    assert outcome.code == 143
    assert outcome.stderr.startswith("error: terminated (SIGTERM); nothing of this run was written to ")
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError], ids=["ctrl-c", "exception"])
def test_fault_inside_a_hook_removes_every_hook_and_writes_nothing(fault, tmp_path, monkeypatch, raised):
    real_record = Recorder.record

    def broken(self, tensor, **kwargs):
        if tensor.device.type == "meta":  # the plan's rehearsal: not the step this test breaks
            return real_record(self, tensor, **kwargs)
        raise raised("hook failed")

    monkeypatch.setattr(Recorder, "record", broken)
    if raised is KeyboardInterrupt:
        assert fault("hooks=stats", forwards=1).code == 130
    else:  # a bug, not a user error: the traceback is the useful report, Hydra exits 1
        with pytest.raises(RuntimeError, match="hook failed"):
            execute(make_config("model=convnet", "hooks=stats"), tmp_path / "out", [])
        assert_no_partial_output(tmp_path / "out")


def test_nonfinite_error_names_the_step_and_the_first_layer(fault):
    outcome = fault("model=custom", "model._target_=models_for_tests.PoisonedAtStep2", "data.shape=[2,3]",
                    "hooks=stats", "hooks.stats.layers=leaf:**", "steps=4", "on_nonfinite=error", forwards=3)
    assert outcome.code == 1
    assert outcome.stderr.startswith(
        "error: step 2: non-finite values first appeared in hooks.stats at layer 'log' (forward output, slot 0, "
        "call 0): 6 NaN, 0 Inf")


def test_nonfinite_loss_alone_is_named(fault):
    outcome = fault("hooks=clip", "loss=log_mean", "on_nonfinite=error", forwards=1)
    assert outcome.code == 1
    assert "error: step 0: the loss is nan while every hooked tensor was finite" in outcome.stderr


def test_output_path_under_a_file_is_refused_before_the_model_is_built(fault, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    outcome = fault("hooks=stats", out=tmp_path / "file" / "out")
    assert outcome.code == 1
    assert outcome.stderr == (f"error: cannot write '{tmp_path}/file/out': '{tmp_path}/file' "
                              f"is not a writable directory")


def test_complete_run_is_not_overwritten_unless_asked(capsys, tmp_path, watch):
    out = run(make_config("model=convnet"), tmp_path / "done")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(SystemExit) as exit_:
        execute(make_config("model=convnet", "hooks=stats"), out, [])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: overwrite: '{out}' already holds a complete run (manifest.json); pass overwrite=true to "
        f"replace it, or choose another hydra.run.dir")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert watch.forwards == 1  # the first run's only
    run(make_config("model=convnet", "hooks=stats", "overwrite=true"), out)
    assert pq.read_metadata(out / "stats.parquet").num_rows == 8


def test_read_only_output_directory_fails_before_the_model_is_built(fault, tmpfs):
    ro = tmpfs("ro,size=64k")
    outcome = fault("hooks=stats", out=ro / "out")
    assert outcome.code == 1
    assert outcome.stderr == f"error: cannot write '{ro}/out': '{ro}' is not a writable directory"


def test_disk_full_during_the_write_names_the_file_and_leaves_nothing(fault, tmpfs):
    small = tmpfs("size=256k")
    out = small / "out"
    outcome = fault("hooks=extract", "hooks.extract.layers=[conv,relu]", "data.shape=[64,3,8,8]", "steps=10",
                    out=out, forwards=10)
    assert outcome.code == 1
    assert outcome.stderr.startswith(f"error: cannot write '{out}/")
    assert outcome.stderr.endswith(": No space left on device")
    assert sorted(p.name for p in out.iterdir()) == []


# --- the real CLI, in a subprocess -------------------------------------------------------------

def start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)


def wait_for_temp_file(proc: subprocess.Popen, out: Path, timeout: float = 120) -> None:
    """Block until the run has opened its output files (its first temporary file exists)."""
    deadline = time.monotonic() + timeout
    while not list(out.glob(".*.tmp-*")):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before writing: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no temporary file appeared")
        time.sleep(0.05)


#: A run that writes a row group each step (files open at their first rows: ``output.row_group_mb`` small)
LONG_RUN = ("model=mlp", "hooks=stats", "steps=1000000", "output.row_group_mb=0.0001")


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                 (signal.SIGINT, 130, "interrupted")], ids=["SIGTERM", "SIGINT"])
def test_signal_leaves_no_final_and_no_temp_file(tmp_path, signum, code, word):
    proc = start_cli(*LONG_RUN, f"hydra.run.dir={tmp_path}")
    wait_for_temp_file(proc, tmp_path)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert stderr.strip().splitlines()[-1].startswith(f"error: {word}; nothing of this run was written to ")
    assert "Traceback" not in stderr
    assert_no_partial_output(tmp_path)


@pytest.mark.slow
def test_sigkill_leaves_only_a_temp_file_that_the_next_run_removes(tmp_path):
    proc = start_cli(*LONG_RUN, f"hydra.run.dir={tmp_path}")
    wait_for_temp_file(proc, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    orphans = sorted(p.name for p in tmp_path.glob(".*.tmp-*"))
    assert orphans and all(name.endswith(f".parquet.tmp-{proc.pid}") for name in orphans), orphans
    assert not list(tmp_path.glob("*.parquet")) and not (tmp_path / "manifest.json").exists()

    out = run(make_config("model=mlp", "hooks=stats"), tmp_path)
    assert not list(out.glob(".*.tmp-*"))
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


@pytest.mark.slow
def test_sweep_with_one_bad_job_is_rejected_before_any_job_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", "model=convnet", "hooks=clip",
                           "hooks.clip.layers=fc,fcc,conv", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: sweep rejected before any job ran: 1 of 3 jobs are invalid",
        "error: job 1 (model=convnet hooks=clip hooks.clip.layers=fcc): hooks.clip.layers: 'fcc' matches no module; "
        "did you mean 'fc'? (module names: '', 'conv', 'relu', 'flatten', 'fc'; plan=true lists them all)"]
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_sweep_job_failing_at_run_time_is_reported_and_the_others_complete(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", "model=convnet", "hooks=stats", "on_nonfinite=error",
                           "loss=sum,log_mean,mean", f"hydra.sweep.dir={sweep}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    failed = "job 1 (model=convnet hooks=stats on_nonfinite=error loss=log_mean): failed: step 0: the loss is nan"
    assert proc.stderr.strip().splitlines()[-2:] == [
        "error: 1 of 3 jobs failed:", proc.stderr.strip().splitlines()[-1]]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {failed}")
    assert sorted(p.name for p in (sweep / "0").iterdir() if p.suffix == ".parquet") == [
        "stats.parquet", "steps.parquet"]  # no tensor kept: no tensors.parquet
    assert (sweep / "0" / "manifest.json").exists() and (sweep / "2" / "manifest.json").exists()
    assert_no_partial_output(sweep / "1")
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_cli_refuses_a_complete_run_before_hydra_touches_its_directory(tmp_path):
    out = tmp_path / "done"
    run(make_config("model=convnet"), out)
    (out / ".hydra").mkdir()
    (out / ".hydra" / "config.yaml").write_text("the finished run's config\n")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    proc = subprocess.run([sys.executable, "-m", "runner", "model=convnet", "hooks=stats", f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: overwrite: '{out}' already holds a complete run (manifest.json); pass overwrite=true to "
        f"replace it, or choose another hydra.run.dir")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


@pytest.mark.parametrize("content, message", [
    (b"", "model.checkpoint: cannot read '{path}' as a weights-only state_dict"),
    (b"not a zip file at all", "model.checkpoint: cannot read '{path}' as a weights-only state_dict"),
    ("truncated", "model.checkpoint: cannot read '{path}' as a weights-only state_dict"),
    ("tensor", "model.checkpoint: '{path}' holds a Tensor, not a state_dict"),
], ids=["empty", "corrupt", "truncated", "wrong type"])
def test_a_bad_checkpoint_is_one_line(fault, tmp_path, content, message):
    path = tmp_path / "weights.pt"
    if content == "truncated":
        torch.save(ConvNet().state_dict(), path)
        path.write_bytes(path.read_bytes()[:200])
    elif content == "tensor":
        torch.save(torch.zeros(3), path)
    else:
        path.write_bytes(content)
    outcome = fault(f"model.checkpoint={path}", out=tmp_path / "out")
    assert outcome.code == 2
    assert outcome.stderr.startswith("error: " + message.format(path=path))


def test_offload_disk_into_a_missing_directory_is_one_line(fault, tmp_path):
    outcome = fault("hooks=offload", "hooks.offload.mode=offload_disk", f"hooks.offload.directory={tmp_path}/nope")
    assert outcome.code == 2
    assert outcome.stderr.startswith(f"error: hooks.offload.directory: '{tmp_path}/nope' is not a writable directory")


@pytest.mark.parametrize("text, message", [
    ("# @package hooks.bad\ntype: stats\nlayers: [a, b\n", "bad.yaml, line 4: expected ',' or ']'"),
    ("# @package hooks.bad\ntype: stats\nlayers: fc\nlayers: conv\n", "bad.yaml, line 4: found duplicate key layers"),
], ids=["syntax", "duplicate key"])
def test_a_broken_yaml_file_is_one_line_naming_file_and_line(fault, tmp_path, text, message):
    (tmp_path / "conf" / "hooks").mkdir(parents=True)
    (tmp_path / "conf" / "hooks" / "bad.yaml").write_text(text)
    outcome = fault(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "hooks=bad")
    assert outcome.code == 2
    assert outcome.stderr.startswith(f"error: {tmp_path / 'conf' / 'hooks'}/") and message in outcome.stderr


@pytest.mark.parametrize("policy", ["warn", "error"])
def test_an_entry_that_matched_but_recorded_nothing_is_named(tmp_path, policy, recwarn):
    """The first layer's input needs no gradient: PyTorch gives conv no grad_input, and the run says so."""
    overrides = ["model=convnet", "hooks=stats", "hooks.stats.layers=conv", "hooks.stats.kinds=[grad_input]",
                 f"on_silent={policy}"]
    if policy == "error":
        with pytest.raises(ConfigError, match=r"^hooks.stats recorded no grad_input on 'conv' in step 0: .*on_silent=error"):
            run(make_config(*overrides), tmp_path / "run", overrides)
        assert_no_partial_output(tmp_path / "run")
        return
    run(make_config(*overrides), tmp_path / "run", overrides)
    messages = [str(w.message) for w in recwarn]
    assert any(m.startswith("hooks.stats recorded no grad_input on 'conv' in step 0") for m in messages), messages


@pytest.mark.slow
def test_a_live_runs_directory_is_refused_before_hydra_writes_its_config_there(tmp_path):
    first = start_cli(*LONG_RUN, f"hydra.run.dir={tmp_path}")
    try:
        wait_for_temp_file(first, tmp_path)
        config = (tmp_path / ".hydra" / "config.yaml").read_text()
        overrides = (tmp_path / ".hydra" / "overrides.yaml").read_text()
        second = subprocess.run([sys.executable, "-m", "runner", "model=convnet", "hooks=clip", f"hydra.run.dir={tmp_path}"],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 1
        assert second.stderr.strip().startswith(f"error: cannot write '{tmp_path}'"), second.stderr
        assert f"{first.pid}" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        assert (tmp_path / ".hydra" / "config.yaml").read_text() == config  # the live run's record is its own
        assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == overrides
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
