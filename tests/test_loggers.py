"""Live loggers (``logger=tensorboard|wandb``, ``runner.live``): what each tool's own reader reads back
equals the run's parquet values; a slow or failing tool costs the run one warning and nothing else."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import runner
import runner.analysis as analysis
from common.errors import ConfigError
from logged_values import expected_scalars
from runner.live import LoggerWarning
from wandb_files import offline_runs


#: ``close_timeout_s`` of tests that read every value back: ``wandb.init`` alone takes a minute on a loaded machine.
SLOW_START_S = 600


def read_events(directory):
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    return events


def test_tensorboard_logs_every_value_parquet_holds_during_a_training_run_with_eval(run_with):
    run_dir = run_with("model=convnet", "data=fake", "loss=cross_entropy", "optimizer=sgd", "steps=4", "eval_every=2",
                       "hooks=[stats,extract]", "hooks.extract.layers=[conv]", "hooks.extract.kinds=[output]",
                       "logger=tensorboard")
    events = read_events(run_dir / "tensorboard")
    logged = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    expected = expected_scalars(run_dir)
    assert set(logged) == set(expected)
    assert any(tag.startswith("eval/stats/") for _, tag in logged) and (1, "eval/loss") in logged
    for key, value in expected.items():  # TensorBoard keeps scalars as float32
        assert logged[key] == pytest.approx(np.float32(value), rel=1e-6, abs=1e-30), key
    tensors = analysis.load_tensors(run_dir)
    assert sorted(events.Tags()["histograms"]) == ["eval/extract/conv/output", "train/extract/conv/output"]
    for event in events.Histograms("train/extract/conv/output"):
        t = tensors[(tensors.phase == "forward") & (tensors.step == event.step)].tensor.iloc[0]
        h = event.histogram_value
        assert (h.num, h.min, h.max) == (t.size, pytest.approx(t.min()), pytest.approx(t.max()))
        assert h.sum == pytest.approx(float(t.sum(dtype=np.float64)), rel=1e-5, abs=1e-6)
    assert [e.step for e in events.Histograms("train/extract/conv/output")] == [0, 1, 2, 3]


def test_tensorboard_every_entries_and_stats_choose_what_is_logged(run_with):
    run_dir = run_with("model=convnet", "steps=5", "hooks=[stats,extract]", "hooks.extract.layers=[fc]", "hooks.extract.kinds=[input,output]",
                       "logger=tensorboard", "logger.tensorboard.every=2", "logger.tensorboard.entries=[extract]",
                       "logger.tensorboard.stats.output=[mean,zero_frac]",
                       "logger.tensorboard.stats.grad_output=[]", "logger.tensorboard.stats.input=[max]", "logger.tensorboard.histograms=false")
    events = read_events(run_dir / "tensorboard")
    logged = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    expected = expected_scalars(run_dir, entries=("extract",), stats={"output": ["mean", "zero_frac"], "input": ["max"], "param_grad": ["l2"]},
                               every=2)
    assert set(logged) == set(expected) and {step for step, _ in logged} == {0, 2, 4}
    assert {tag.split("/")[-1] for _, tag in logged} == {"loss", "mean", "zero_frac", "max"}
    assert logged == {key: pytest.approx(np.float32(value), rel=1e-6, abs=1e-30) for key, value in expected.items()}
    assert events.Tags()["histograms"] == []


def train_attached(model, steps, **attach):
    """A plain training loop under ``runner.attach``; eval passes after steps 1 and 3."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with runner.attach(model, **attach) as run:
        for i in range(steps):
            x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.step(loss)
            if i % 2 == 1:
                with torch.no_grad(), run.evaluating() as result:
                    result.set(nn.functional.cross_entropy(model(torch.randn(6, 4)), y))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_wandb_offline_run_files_hold_every_value_parquet_holds(tmp_path):
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_attached(mlp(), 4, hooks={"stats": {"type": "stats", "layers": "**"},
                                        "keep": {"type": "capture", "layers": "2", "kinds": ["output"]}},
                       out_dir=out, logger={"wandb": {"project": "tests", "close_timeout_s": SLOW_START_S}})
    assert [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)] == []
    (logged,) = offline_runs(out / "wandb")
    expected = expected_scalars(out)
    assert logged.scalars() == expected  # JSON doubles: exactly the parquet values
    assert logged.run.project == "tests" and logged.run.run_group == "" and logged.run.display_name == "run"
    assert logged.config["hooks"]["stats"]["type"] == "stats" and logged.config["overrides"] == ["hooks=[]"]
    tensors = analysis.load_tensors(out)
    for step in range(4):
        histogram = logged.histogram(step, "train/keep/2/output")
        t = tensors[(tensors.phase == "forward") & (tensors.step == step)].tensor.iloc[0]
        assert sum(histogram["values"]) == t.size
        assert histogram["bins"][0] == pytest.approx(t.min()) and histogram["bins"][-1] == pytest.approx(t.max())


class Blocking:
    """A tool that stops answering after its first line (a server that hangs)."""

    def __init__(self) -> None:
        self.lines, self.release = [], threading.Event()

    def log(self, line) -> None:
        self.lines.append(line)
        if len(self.lines) > 1:
            self.release.wait()

    def close(self, failed: bool) -> None:
        self.closed = failed


class Failing:
    """A tool whose server refuses every line."""

    def __init__(self) -> None:
        self.calls = 0

    def log(self, line) -> None:
        self.calls += 1
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    def close(self, failed: bool) -> None:
        pass


def test_a_hanging_and_a_refusing_tool_are_said_with_why_and_what_they_lost_and_never_cost_the_run(tmp_path):
    hanging, refusing = Blocking(), Failing()
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_attached(mlp(), 12, hooks=["stats"], out_dir=out, sinks={"wandb": hanging, "mlflow": refusing},
                       logger={"tensorboard": {}, "wandb": {"queue": 2, "close_timeout_s": 0.2}, "mlflow": {}})
    hanging.release.set()
    said = [str(w.message) for w in caught if issubclass(w.category, LoggerWarning)]  # in the loggers' order
    refused = "logger mlflow: ConnectionRefusedError: [Errno 111] Connection refused"
    assert said == [  # the refusal when the step after it ends, then at the run's end what each lost and why
        f"{refused}; the lines it cannot send are dropped and the run goes on (the parquet files are its record)",
        # the first line the tool took sent, the next held by the hung tool, the newest 2 waiting at the end,
        # the 14 between skipped (which line came first is the threads' timing: usually step 0, under load later)
        "logger wandb: sent nothing for close_timeout_s=0.2 at the run's end: 17 of 18 lines not sent, 14 of them "
        f"skipped while it fell behind (the last sent was step {hanging.lines[0].step}); the parquet files are the "
        "run's record",
        f"{refused}: 18 of 18 lines not sent (none was sent); the parquet files are the run's record"]
    assert refusing.calls == 18  # 12 training lines and 6 eval lines, each tried
    steps = analysis.load_steps(out)
    assert len(steps) == 18 and sorted(set(analysis.load_stats(out).step)) == list(range(12))  # the record is complete
    events = read_events(out / "tensorboard")  # a working logger beside them logged every line
    assert set((e.step, tag) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)) == \
        set(expected_scalars(out))


@pytest.mark.parametrize("overrides, message", [
    (["logger=tensorboard", "logger.tensorboard.stats.output=[stdd]"],
     "logger.tensorboard.stats.output: unknown statistic 'stdd'; valid: abs_mean, inf_count, l2, max, mean, min, "
     "nan_count, std, zero_frac; did you mean 'std'?"),
    (["logger=tensorboard", "logger.tensorboard.stats.outptu=[std]"], "did you mean 'output'?"),
    (["logger=tensorboard", "logger.tensorboard.entries=[stat]"],
     "logger.tensorboard.entries: unknown hook entry 'stat'; valid: stats; did you mean 'stats'?"),
    (["logger=tensorboard", "logger.tensorboard.every=0"], "logger.tensorboard.every: 0 must be at least 1"),
    (["logger=wandb", "logger.wandb.mode=onlin"], "logger.wandb.mode"),
    (["logger=tensorbord"], "did you mean 'tensorboard'?"),
])
def test_a_bad_logger_setting_is_one_line_and_status_2(fault, overrides, message):
    outcome = fault("hooks=stats", *overrides)
    assert outcome.code == 2 and message in outcome.stderr, outcome.stderr


def test_a_chosen_logger_whose_library_is_missing_names_the_pip_command(fault, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    outcome = fault("hooks=stats", "logger=[tensorboard,mlflow]")
    assert outcome.code == 2
    assert outcome.stderr == ("error: logger=mlflow: the 'mlflow' package is not installed; "
                               "pip install 'hook-runner[loggers]'")
    with pytest.raises(ConfigError, match=r"logger=mlflow: the 'mlflow' package is not installed"):
        train_attached(mlp(), 1, hooks=["stats"], logger=["mlflow"])


def test_lightning_logs_through_the_trainers_own_tensorboard_logger(tmp_path):
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import TensorBoardLogger
    from test_integrations_lightning import Classifier, loader

    from runner.integrations.lightning import HookCallback

    own = TensorBoardLogger(save_dir=tmp_path / "tb", name="mine")
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=own, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                                callbacks=[HookCallback(hooks=["stats"], out_dir=tmp_path / "pl", logger=["tensorboard"])])
    trainer.fit(Classifier(), loader())
    assert not (tmp_path / "pl" / "tensorboard").exists()  # not a second event directory: the trainer's own
    events = read_events(own.log_dir)
    logged = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)
              if tag.startswith(("train/", "eval/"))}
    expected = expected_scalars(tmp_path / "pl")
    assert set(logged) == set(expected) and len(expected) > 4
    assert logged == {key: pytest.approx(np.float32(value), rel=1e-6, abs=1e-30) for key, value in expected.items()}
    assert "accuracy" in events.Tags()["scalars"]  # what the module logs itself, beside


def test_lightning_logs_into_the_trainers_own_wandb_run(tmp_path):
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import WandbLogger
    from test_integrations_lightning import Classifier, loader

    from runner.integrations.lightning import HookCallback
    from runner.live.to_wandb import STEP_KEY

    import wandb

    # the user's own offline run, handed to Lightning's logger
    own = WandbLogger(experiment=wandb.init(mode="offline", project="pl", dir=str(tmp_path / "own"), reinit="create_new"))
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=own, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                                callbacks=[HookCallback(hooks=["stats"], out_dir=tmp_path / "pl", logger=["wandb"])])
    trainer.fit(Classifier(), loader())
    own.experiment.finish()
    assert not (tmp_path / "pl" / "wandb").exists()
    (logged,) = offline_runs(tmp_path / "own")
    ours = {(row[STEP_KEY], key): value for row in logged.history.values() if STEP_KEY in row
            for key, value in row.items() if key.startswith(("train/", "eval/"))}
    assert ours == expected_scalars(tmp_path / "pl")


def test_hugging_face_logs_into_the_trainers_own_tensorboard_directory(tmp_path):
    pytest.importorskip("transformers")
    from test_integrations_huggingface import OVERRIDES, STEPS, tiny_gpt2, train

    from runner.integrations.huggingface import HookCallback

    callback = HookCallback(hooks=["stats"], overrides=OVERRIDES[1:], out_dir=tmp_path / "hf", logger=["tensorboard"])
    train(tiny_gpt2(), callback, tmp_path, report_to=["tensorboard"], logging_steps=1)
    assert not (tmp_path / "hf" / "tensorboard").exists()  # not a second event directory: the Trainer's own
    (own,) = (tmp_path / "hf-trainer" / "runs").iterdir()
    events = read_events(own)
    logged = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)
              if tag.startswith("train/stats/")}
    expected = {key: value for key, value in expected_scalars(tmp_path / "hf").items() if key[1] != "train/loss"}
    assert set(logged) == set(expected) and {step for step, _ in logged} == set(range(STEPS))
    assert logged == {key: pytest.approx(np.float32(value), rel=1e-6, abs=1e-30) for key, value in expected.items()}
    # the Trainer's own loss, at its own steps, is the only one under its tag: the run's is not mixed in
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))
    assert "args/text_summary" in events.Tags()["tensors"]  # the text the Trainer's TensorBoardCallback wrote, beside


def test_hugging_face_logs_into_the_trainers_own_wandb_run(tmp_path):
    pytest.importorskip("transformers")
    from test_integrations_huggingface import OVERRIDES, STEPS, tiny_gpt2, train

    from runner.integrations.huggingface import HookCallback
    from runner.live.to_wandb import STEP_KEY

    import wandb

    # the user's own offline run, which the Trainer's WandbCallback reports into (W&B reads WANDB_MODE once a process)
    own = wandb.init(mode="offline", project="hf", dir=str(tmp_path / "own"), reinit="finish_previous")
    callback = HookCallback(hooks=["stats"], overrides=OVERRIDES[1:], out_dir=tmp_path / "hf", logger=["wandb"])
    train(tiny_gpt2(), callback, tmp_path, report_to=["wandb"], logging_steps=1)
    assert wandb.run is own
    own.finish()  # the Trainer leaves the run open after train()
    assert not (tmp_path / "hf" / "wandb").exists()
    (logged,) = offline_runs(tmp_path / "own")
    ours = {(row[STEP_KEY], key): value for row in logged.history.values() if STEP_KEY in row
            for key, value in row.items() if key.startswith(("train/", "eval/")) and key != "train/global_step"}
    expected = {key: value for key, value in expected_scalars(tmp_path / "hf").items() if key[1] != "train/loss"}
    assert ours == expected and {step for step, _ in ours} == set(range(STEPS))
    # the Trainer's own loss is the only one under its tag: the run's is left out of its rows
    assert [row["train/loss"] for row in logged.history.values() if "train/loss" in row] == pytest.approx(
        [float(v) for v in analysis.load_steps(tmp_path / "hf").loss], rel=1e-3)


def test_the_trainers_tensorboard_directory_gets_no_file_until_a_chosen_logger_sends_a_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    from torch.utils.tensorboard import SummaryWriter

    from runner.integrations.huggingface import reported_sinks
    from runner.live.lines import LogLine

    own = tmp_path / "runs" / "Nov26_06-00-00_host"
    SummaryWriter(log_dir=str(own)).close()  # what the Trainer's TensorBoardCallback made at on_train_begin
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=["tensorboard"])
    sink = reported_sinks(args)["tensorboard"]
    assert len(list(own.iterdir())) == 1  # a logger not chosen leaves the Trainer's directory as it was
    sink.log(LogLine(3, {"train/loss": 1.5, "train/stats/fc/output/std": 0.25}, measures={"train/loss"}))
    sink.close(failed=False)
    assert len(list(own.iterdir())) == 2
    events = read_events(own)
    assert events.Tags()["scalars"] == ["train/stats/fc/output/std"]
    assert [(e.step, e.value) for e in events.Scalars("train/stats/fc/output/std")] == [(3, 0.25)]
