"""Where runs are tracked: the MLflow tracking URI and artifact location a
config gives, and new SQLite stores (MLflow's tracking store, the local stack's
Prefect database), which start as a copy of an empty one whose schema is
already migrated.

Each tool otherwise runs its whole chain of schema migrations on every new
database: seconds of CPU for MLflow, tens of seconds for Prefect, paid at a new
root's first run and at every fresh `gpt2 stack up`. The migrated empty store
is made once per tool version in the user's cache; a copy is linked in under
the final name, so a store another process created first is never replaced.
A failure here only means the tool migrates the store itself.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from gpt2.config.tree import Config
from gpt2.root import layout

log = logging.getLogger(__name__)

_LOCK = threading.Lock()  # migration code is not thread-safe; processes each use their own temp files


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpt2-pipeline"


def _unique(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{suffix}")


def seed(path: Path, template_name: str, make: Callable[[Path], None]) -> bool:
    """Create the missing store `path` as a copy of the template `template_name`
    (made by `make(file)` if the cache has none). True if `path` was seeded."""
    if path.exists():
        return False
    try:
        template = cached_file(template_name, make)
        tmp = _unique(path, "seed")
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, path)  # fails if the store appeared meanwhile: theirs is kept
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    except Exception as err:  # noqa: BLE001 - only a shortcut; the tool creates the store without it
        log.debug("no seeded store at %s (%s); its tool creates it", path, err)
        return False


def cached_file(name: str, make: Callable[[Path], None]) -> Path:
    """The file `name` in the user's cache, made by `make(file)` the first time (by one process
    of several at once: the others wait for it), then kept: a name says what made it."""
    template = cache_dir() / name
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    # Several first runs at once (pytest workers, a stack's services) wait for
    # one to make it rather than each spending the migrations.
    with _LOCK, open(template.with_name(f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if template.exists():
            return template
        tmp = _unique(template, "new")
        try:
            make(tmp)
            os.replace(tmp, template)
        finally:
            tmp.unlink(missing_ok=True)
        return template


def default_tracking_uri(config: Config) -> str:
    """`tracking.uri`, else $MLFLOW_TRACKING_URI, else a SQLite store beside a
    local root, else one in the work dir."""
    if config.tracking.uri:
        return config.tracking.uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{layout.mlflow_db(config)}"


def answers(uri: str) -> float:
    """Seconds the store at `uri` took to answer a query (gpt2 preflight); raises what reaching it raised."""
    from mlflow import MlflowClient  # before the clock starts

    started = time.perf_counter()
    MlflowClient(uri).search_experiments(max_results=1)
    return time.perf_counter() - started


def artifact_location(config: Config) -> str:
    """Under the artifact root (not ./mlruns in the cwd) where MLflow can write; else the work dir."""
    return layout.mlflow_artifacts(config)


def prepare_sqlite(uri: str) -> None:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:///:memory:"):
        path = Path(uri[len("sqlite:///"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        seed_sqlite_store(path)


def seed_sqlite_store(path: Path) -> None:
    """A new SQLite store starts as a migrated empty copy (seed, above): MLflow would
    otherwise spend 2-4 s of CPU on its schema migrations at a new root's first run."""
    import mlflow

    seed(path, f"mlflow-{mlflow.__version__}-empty.db", _make_empty_store)


def _make_empty_store(path: Path) -> None:
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine

    engine = create_sqlalchemy_engine(f"sqlite:///{path}")
    try:
        # Tables only: MLflow makes the Default experiment (its artifacts: the copy's own) on first open.
        _initialize_tables(engine)
    finally:
        engine.dispose()
