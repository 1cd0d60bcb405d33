"""Read a W&B offline run back from its own files: the ``.wandb`` record log (W&B's LevelDB-style
log of ``wandb_internal_pb2.Record`` protobufs, as ``wandb sync`` reads it), decoded with W&B's protos."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

#: The file's header (``:W&B``, magic, version), the log's blocks, and a record's header (crc, length, type).
HEADER, BLOCK, RECORD_HEADER = 7, 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    """Every complete record of a ``run-ID.wandb`` file, in order (the file may be read while W&B's
    service still writes it: a record cut at the end is left for the next read)."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:HEADER]
    pos, parts = HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < RECORD_HEADER:  # a block's tail too short for a header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + RECORD_HEADER])
        if kind == 0 and length == 0:
            pos += room
            continue
        if pos + RECORD_HEADER + length > len(data):  # the service is still writing this record
            return
        parts += data[pos + RECORD_HEADER:pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


#: How long the W&B service (a process of its own) may take to write a finished run's last records.
WRITTEN_WITHIN_S = 120


def finished_records(path: Path) -> list:
    """The records of a finished run, once W&B's service has written its ``exit`` record (``run.finish()``
    returns before its service process has written everything)."""
    deadline = time.monotonic() + WRITTEN_WITHIN_S
    while True:
        found = list(records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


class OfflineRun:
    """One offline run: ``run`` (its id, group, name, config) and ``history`` ({step: {key: value}})."""

    def __init__(self, run_dir: Path) -> None:
        (path,) = Path(run_dir).glob("run-*.wandb")
        self.history: dict[int, dict] = {}
        self.run = None
        for record in finished_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                self.run = record.run
            elif kind == "history":
                row = self.history.setdefault(record.history.step.num, {})
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):
                        row[key] = json.loads(item.value_json)

    @property
    def config(self) -> dict:
        return {item.key: json.loads(item.value_json) for item in self.run.config.update}

    def histogram(self, step: int, tag: str) -> dict:
        """The ``wandb.Histogram`` logged as ``tag`` at ``step``: ``values`` (counts) and ``bins`` (edges)."""
        row = self.history[step]
        assert row[f"{tag}/_type"] == "histogram"
        return {"values": row[f"{tag}/values"], "bins": row[f"{tag}/bins"]}

    def scalars(self) -> dict[tuple[int, str], float]:
        """``{(step, tag): value}`` of every scalar logged (histograms are ``TAG/_type``, ``TAG/values``...)."""
        return {(step, key): value for step, row in self.history.items() for key, value in row.items()
                if isinstance(value, (int, float)) and not key.endswith(("/_type", "/values", "/bins"))}


def offline_runs(directory: Path) -> list[OfflineRun]:
    """Every offline run under ``directory`` (a run directory's or a sweep's ``wandb/``)."""
    return [OfflineRun(d) for d in sorted(Path(directory).rglob("offline-run-*")) if d.is_dir()]
