"""Live loggers: a run's loss, step measures and chosen statistics in TensorBoard, W&B or MLflow while it runs.

``logger=tensorboard`` (several at once: ``'logger=[tensorboard,wandb]'``; none by default) or
``runner.attach(..., logger=["mlflow"])``. The parquet files stay the run's record: each step's
log line is made from the captures on the background writer's thread (``lines``), after its
parquet rows, and handed to one thread per logger through a bounded queue (``channel``), which sends
it to the tool running in a process of its own at a lower CPU priority (``process``), so a slow or
unreachable server drops log lines (the oldest waiting first), said in a warning naming why, and
never slows or fails the run.
Each tool's library is imported only when it is chosen (``pip install 'hook-runner[loggers]'``).
"""
from runner.live.config import LOGGER_EXTRA, LoggerConfig, register_backends, typed_loggers
from runner.live.loggers import LiveLoggers, LoggerWarning, RunContext

register_backends()  # the choices and their schemas (logger_schema/NAME), before any config is composed

__all__ = ["LOGGER_EXTRA", "LiveLoggers", "LoggerConfig", "LoggerWarning", "RunContext", "typed_loggers"]
