"""What every stage's tasks share: cache keys on identity + code version,
result storage in the artifact root (as JSON, see tasks.results), and a throttled progress artifact.

Cache keys never include runtime settings (workers, device, root), so moving
to a bigger machine keeps the cache; results live under the artifact root, so
a rerun on any machine that sees the root skips finished work.
"""

from __future__ import annotations

import hashlib
import logging
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

from prefect.tasks import Task

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout
from tasks.results import RootJSONSerializer, RootResultStorage

log = logging.getLogger(__name__)


def _package_version() -> str:
    try:
        return version("gpt2-pipeline")
    except PackageNotFoundError:
        return "dev"


# What changes results is versioned in gpt2.config.identity (*_FORMAT_VERSION enter
# every fingerprint and path); the package version joins the key so a release
# re-validates its caches (steps are idempotent, so that costs seconds).
CODE_VERSION = _package_version()


def identity_cache_key(step: str, fingerprint: Callable[[Config], str]) -> Callable[[Any, dict], str]:
    """A cache_key_fn keyed on the stage identity of the `config` parameter."""

    def key(_context: Any, parameters: dict) -> str:
        return f"{step}-{fingerprint(parameters['config'])}-{CODE_VERSION}"

    return key


def result_storage(config: Config) -> RootResultStorage:
    """Prefect result storage under the artifact root (`<root>/.prefect/results`)
    that reads JSON records only (tasks.results says why). Saved, because
    Prefect only accepts persisted blocks as task result storage."""
    url = layout.prefect_results(config)
    block = RootResultStorage(basepath=url)
    block.save(f"gpt2-results-{hashlib.sha256(url.encode()).hexdigest()[:12]}", overwrite=True)
    return block


def bind(task: Task, config: Config, refresh: bool = False) -> Task:
    """The task with its results stored in this config's artifact root, as data."""
    return task.with_options(result_storage=result_storage(config), result_serializer=RootJSONSerializer(),
                             refresh_cache=refresh or None)


def not_user_error(task: Task, task_run: Any, state: Any) -> bool:
    """A stage task's retry condition: retry what may pass next time (a
    network read, a preempted machine), never bad input or damaged data
    (gpt2.errors.UserError), which would fail the same way after each delay."""
    return not isinstance(state.result(raise_on_failure=False), UserError)


def run_cached(task: Task, config: Config, *args: Any, valid: Callable[[Any], bool] = lambda _: True):
    """Run a cached task; if a cached result's outputs are gone (another
    machine, a cleaned scratch dir), run it again with the cache refreshed.

    Returns (result, cached: bool).
    """
    state = bind(task, config)(config, *args, return_state=True)
    result = state.result()
    if state.is_completed() and state.name == "Cached" and not valid(result):
        log.warning("cached %s result points at outputs that are gone; recomputing", task.name)
        state = bind(task, config, refresh=True)(config, *args, return_state=True)
        result = state.result()
    return result, state.name == "Cached"


class ProgressArtifact:
    """A Prefect progress artifact updated at most every `every` seconds."""

    def __init__(self, description: str, every: float = 2.0):
        from prefect.artifacts import create_progress_artifact

        self.every, self.last = every, 0.0
        self.id = create_progress_artifact(progress=0.0, description=description)

    def update(self, fraction: float, force: bool = False) -> None:
        from prefect.artifacts import update_progress_artifact

        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            try:
                update_progress_artifact(self.id, progress=round(100 * min(max(fraction, 0.0), 1.0), 1))
            except Exception:  # noqa: BLE001 - a progress display never fails the work
                log.debug("progress artifact update failed", exc_info=True)
