"""A background sender that survives outages of whatever it sends to.

Producers only append (never block on the network). One thread connects,
sends queued records (in order) and metric points (in batches), and while the
destination is down keeps everything, warns once, and retries with backoff.
The tracking module uses it for MLflow; it knows nothing about MLflow.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from gpt2.secrets import redact

log = logging.getLogger(__name__)

Send = Callable[[Any], None]
"""fn(connection) that sends one queued record."""

_RUNNING: weakref.WeakSet = weakref.WeakSet()


def running() -> list[Outbox]:
    """The outboxes of this process whose sender thread was not stopped (an
    owner that ends without close(), e.g. a test, can stop what it started)."""
    return list(_RUNNING)


class Outbox:
    def __init__(self, name: str, connect: Callable[[], Any], send_batch: Callable[[Any, list], None],
                 batch_size: int = 1000, interval_s: float = 5.0, max_backoff_s: float = 60.0,
                 fence: Callable[[], bool] | None = None):
        """`fence`: asked before every send; once it answers False its owner has
        lost the right to send (a trainer whose run another took over): what is
        queued is dropped and nothing more is sent."""
        self.name, self._connect, self._send_batch, self._fence = name, connect, send_batch, fence
        self._batch_size, self._interval, self._max_backoff = batch_size, interval_s, max_backoff_s
        self._points: deque = deque()
        self._records: deque[tuple[str, Send]] = deque()
        self._lock, self._wake, self._tried = threading.Lock(), threading.Event(), threading.Event()
        self._connected, self._stopping = False, False
        self.outage: str | None = None
        self.attempts = self._started = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}-sender", daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    def wait_first_attempt(self, timeout: float) -> None:
        self._tried.wait(timeout)

    def put(self, what: str, send: Send) -> None:
        with self._lock:
            self._records.append((what, send))
        self._wake.set()

    def put_points(self, points: list) -> None:
        with self._lock:
            self._points.extend(points)
        if len(self._points) >= self._batch_size:
            self._wake.set()

    def pending(self) -> tuple[int, int]:
        """(metric points, other records) not sent yet."""
        return len(self._points), len(self._records)

    def unsent_points(self) -> list:
        """The metric points not confirmed sent (a batch in flight included), in order."""
        with self._lock:
            return list(self._points)

    def discard(self) -> int:
        """Drop everything not sent yet and stop (its owner lost the right to
        send: the trainer that took its run over sends those steps itself)."""
        dropped = self.discard_queued()
        self.stop()
        return dropped

    def discard_queued(self) -> int:
        with self._lock:
            dropped = len(self._points) + len(self._records)
            self._points.clear()
            self._records.clear()
        return dropped

    def _busy(self) -> bool:
        return bool(self._points or self._records or not self._connected)

    def flush(self, timeout: float | None = None, give_up_on_outage: bool = False) -> bool:
        """Wait until everything queued is sent; False if still pending at
        `timeout` (or, with give_up_on_outage, once a fresh attempt has failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # An attempt in flight may predate what was just queued: only one
        # that starts after this call tells whether the destination is down.
        target = self._started + 1
        self._wake.set()
        while self._busy():
            if deadline is not None and time.monotonic() > deadline:
                return False
            if give_up_on_outage and self.outage is not None and self.attempts >= target:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        _RUNNING.discard(self)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.0
        while not self._stopping:
            self._started += 1
            ok = self._drain()
            self.attempts += 1
            self._tried.set()
            backoff = 0.0 if ok else min(self._max_backoff, max(1.0, backoff * 2))
            if not ok and self._wake.is_set():
                backoff = 0.0  # a flush is waiting: try again now rather than after the backoff
            self._wake.wait(backoff or self._interval)
            self._wake.clear()

    def _drain(self) -> bool:
        try:
            if self._fence is not None and not self._fence():  # raising: an outage like any other
                log.info("%s: its owner may send no more; dropping %d unsent record(s)", self.name,
                         self.discard_queued())
                self._stopping = True
                return True
            conn = self._connect()
            self._connected = True
            while self._records:
                self._records[0][1](conn)
                with self._lock:
                    self._records.popleft()
            while self._points:
                with self._lock:
                    batch = [self._points[i] for i in range(min(self._batch_size, len(self._points)))]
                self._send_batch(conn, batch)
                with self._lock:
                    for _ in range(min(len(batch), len(self._points))):  # discard() may have emptied it
                        self._points.popleft()
        except Exception as err:  # noqa: BLE001 - an outage must never reach the producer
            # After stop() its owner has already reported what was not sent; an
            # attempt that outlived stop()'s join (the destination's own retries)
            # must stay quiet: whoever logs next may have closed its streams.
            if self.outage is None and not self._stopping:
                # MLflow's REST errors quote the full URL, credentials included.
                first = redact(str(err).splitlines()[0])[:300] if str(err) else ""
                log.warning("%s unavailable (%s: %s); continuing, records are kept and retried",
                            self.name, type(err).__name__, first)
            self.outage = redact(str(err))
            return False
        if self.outage is not None:
            if not self._stopping:
                log.warning("%s reachable again; buffered records sent", self.name)
            self.outage = None
        return True
