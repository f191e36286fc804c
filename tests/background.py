"""A test's uninterrupted reference run, started in the background as the test starts and
collected at its end: it does not depend on what the test does, and it trains while the test
waits on its pipeline's stages and faults instead of after them (~40-60 s of each such test)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def started(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """`fn(*args, **kwargs)` begun in a thread of its own; `.result()` waits for it and raises what it raised."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="reference")
    try:
        return pool.submit(fn, *args, **kwargs)
    finally:
        pool.shutdown(wait=False)
