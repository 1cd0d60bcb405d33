"""``python -m runner replay=RUN_DIR [replay.out=DIR]``: run a finished run again and compare its tables.

The replay runs the run's committed ``config.yaml`` (with its recorded overrides) as it is: no
other override is taken, only where to write (``replay.out``, or Hydra's own ``hydra.run.dir``; default
``outputs/replays/DATE/TIME``; never the run itself, nor any directory holding a complete run).
Before running it says in one line what differs from the run's manifest (versions, config hash,
data and checkpoint fingerprints, threads; ``runner.store.provenance``), and runs anyway. It runs
with ``torch.use_deterministic_algorithms(True)``, cuDNN deterministic and not benchmarking, and the
run's number of threads; then it prints, per table, ``equal`` or where it differs
(``runner.analysis.compare``).

Exit status: 0 when every table is equal; ``EXIT_DIFFERS`` (3) when one differs; 2 for a bad
command line or ``RUN_DIR`` (missing, not a run, incomplete: one line, nothing written); 1 (or
130/143) when the replay's own run fails, as for any run.
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.durable import TMP_MARK
from common.errors import ConfigError
from common.manifest import MANIFEST, ManifestError, read_manifest
from common.run_config import run_config_text
from runner.cli.early import REPLAY_KEY as KEY
from runner.cli.execute import EXIT_CONFIG_ERROR, EXIT_RUN_ERROR, execute, keep_claim
from runner.engine.plan import compile_plan
from runner.store.claim import CompleteRunError, claim_run_dir
from runner.store.commit import CONFIG, DATA_FILES
from runner.store.errors import OutputError
from runner.store.outputs import versions
from runner.store.provenance import differences, provenance

#: Exit status of a replay whose tables differ from the stored run's.
EXIT_DIFFERS = 3
OUT_KEY = f"{KEY}.out"
#: Hydra's own name for a run's directory, taken as ``replay.out`` (where a replay writes is all it may choose).
HYDRA_OUT_KEY = "hydra.run.dir"


def main(argv: Sequence[str]) -> int:
    """Replay the run ``argv`` names; print what differs; return the exit status (see the module doc)."""
    try:
        run_dir, out_dir = parse(argv)
        manifest = check_run_dir(run_dir)
        if out_dir.resolve() == run_dir.resolve():
            raise ConfigError(f"{OUT_KEY}: '{out_dir}' is the run being replayed; name another directory")
        cfg = _stored_config(run_dir)
        overrides = list(manifest.get("overrides", []))
        with deterministic((manifest.get("provenance") or {}).get("threads")):
            plan = compile_plan(cfg, overrides)
            warning = preflight(run_dir, manifest, plan)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
            keep_claim(claim_run_dir(out_dir, overwrite=False))  # a complete run there is refused, never replaced
            execute(cfg, out_dir, overrides, plan=plan, summary=False)  # a failed run exits here, as any run does
    except CompleteRunError as exc:
        print(f"error: {OUT_KEY}: '{exc.out_dir}' already holds a complete run, which a replay never replaces; "
              f"choose another {OUT_KEY}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except OutputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUN_ERROR
    return report(run_dir, out_dir)


def parse(argv: Sequence[str]) -> tuple[Path, Path]:
    """``RUN_DIR`` and the replay's output directory; any other override is refused."""
    values: dict[str, str] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if key not in (KEY, OUT_KEY, HYDRA_OUT_KEY) or not sep:
            raise ConfigError(f"{KEY}: a replay runs the stored config as it was; only {OUT_KEY}=DIR (or "
                              f"{HYDRA_OUT_KEY}=DIR) may come with it, not '{arg}' (to change a setting, run the "
                              f"changed command instead)")
        if not value:
            raise ConfigError(f"{key}: give a directory ({key}=DIR)")
        values[key] = value
    outs = {values[key] for key in (OUT_KEY, HYDRA_OUT_KEY) if key in values}
    if len(outs) > 1:
        raise ConfigError(f"{HYDRA_OUT_KEY}: '{values[HYDRA_OUT_KEY]}' and {OUT_KEY}='{values[OUT_KEY]}' both name "
                          f"where the replay writes; give one of them")
    default = Path("outputs/replays") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")
    return Path(values[KEY]), Path(outs.pop() if outs else default)


def check_run_dir(run_dir: Path) -> dict:
    """The manifest of the complete run in ``run_dir``.

    Raises:
        ConfigError: no such directory, not a run, an incomplete run, or one without ``config.yaml``.
    """
    if not run_dir.exists():
        raise ConfigError(f"{KEY}: no directory '{run_dir}'")
    if not run_dir.is_dir():
        raise ConfigError(f"{KEY}: '{run_dir}' is a file, not a run directory")
    try:
        manifest = read_manifest(run_dir)
    except ManifestError as exc:
        raise ConfigError(f"{KEY}: cannot read '{exc.path}': {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(f"{KEY}: cannot read '{run_dir / MANIFEST}': {exc}") from None
    if manifest is None:
        started = any((run_dir / name).exists() for name in DATA_FILES) or any(run_dir.glob(f".*{TMP_MARK}*"))
        if started:
            raise ConfigError(f"{KEY}: '{run_dir}' holds no complete run (no {MANIFEST}: it failed, was "
                              f"interrupted or is still running)")
        raise ConfigError(f"{KEY}: '{run_dir}' is not a run directory (no {MANIFEST})")
    if manifest.get("complete") is not True:
        raise ConfigError(f"{KEY}: '{run_dir / MANIFEST}' is not the manifest of a complete run")
    if not (run_dir / CONFIG).is_file():
        raise ConfigError(f"{KEY}: '{run_dir}' has no {CONFIG} (made before runs committed their config): "
                          f"nothing to replay")
    return manifest


def _stored_config(run_dir: Path):
    """The run's committed config; one written by ``runner.attach`` (no model: the loop was the user's) is refused."""
    try:
        cfg = OmegaConf.create(run_config_text(run_dir))
    except (OSError, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"{KEY}: cannot read '{run_dir / CONFIG}': {str(exc).splitlines()[0]}") from None
    if "model" not in cfg:
        raise ConfigError(f"{KEY}: '{run_dir}' was recorded by runner.attach in your own loop, which the runner "
                          f"cannot run again; only runs of python -m runner replay")
    return cfg


def preflight(run_dir: Path, manifest: dict, plan) -> str:
    """One line naming what differs between the stored run and this replay ('' when nothing does)."""
    stored_hash = manifest.get("config_hash")
    found = [f"versions.{line}" for line in differences(manifest.get("versions", {}), versions())]
    if _hash(run_config_text(run_dir)) != stored_hash:
        found.append(f"config_hash: {CONFIG} was edited after the run")
    elif _hash(plan.config_yaml) != stored_hash:
        found.append("config_hash: this version resolves the stored config differently (changed defaults)")
    if "provenance" in manifest:
        found += [f"provenance.{line}" for line in differences(manifest["provenance"], provenance(plan))]
    else:
        found.append("provenance: not in the manifest (an older run): data files, checkpoint and threads unchecked")
    return f"the replay differs from the run in: {'; '.join(found)}" if found else ""


def _hash(text: str) -> str:
    """The manifest's config hash (``RunOutputs.config_hash``)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def report(run_dir: Path, out_dir: Path) -> int:
    """Print each table's comparison; return 0 when all are equal, ``EXIT_DIFFERS`` otherwise."""
    from runner.analysis.compare import NOT_COMPARED, compare_runs  # pandas: not at every start-up

    print(f"replay of {run_dir} in {out_dir} (not compared: {', '.join(NOT_COMPARED)})")
    tables = compare_runs(run_dir, out_dir)
    for table in tables:
        print(table.line())
    return 0 if all(t.equal for t in tables) else EXIT_DIFFERS


@contextmanager
def deterministic(threads: int | None) -> Iterator[None]:
    """Deterministic algorithms (and cuDNN, cuBLAS) and ``threads`` intra-op threads; all restored after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.get_num_threads())
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS requires
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        torch.set_num_threads(before[4])
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
