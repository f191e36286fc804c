"""A preflight check's outcome and how it is shown: one line per check as it
finishes (stderr, so stdout stays clean for --json), then the JSON object."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from gpt2.errors import UserError

Status = Literal["ok", "warn", "fail", "skipped"]
ORDER = ("devices", "data", "root", "memory", "compile", "throughput", "collectives", "disk", "lease", "tracking")
"""The checks, in the order they are reported (the JSON keeps every name)."""


@dataclass
class Check:
    name: str
    status: Status
    seconds: float
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status:<7} {self.name:<11} {self.seconds:6.1f}s  {self.detail}"


class Failed(Exception):
    """A check found what stops the run; the message says what and what to change."""

    def __init__(self, detail: str, **figures: Any):
        super().__init__(detail)
        self.figures = figures


class Warned(Exception):
    """A check passed with a finding the user should act on (not raised past `Report.check`)."""

    def __init__(self, detail: str, **figures: Any):
        super().__init__(detail)
        self.figures = figures


class Skipped(Exception):
    """A check that cannot run here: what it needs is missing or failed."""


@dataclass
class Outcome:
    """What a check body returns when it passed: its line and its figures."""

    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


class Report:
    """The checks run so far; `show` is called with each as it finishes."""

    def __init__(self, show: Callable[[Check], None] | None = None):
        self.checks: dict[str, Check] = {}
        self.show = show or (lambda c: None)

    def check(self, name: str, body: Callable[[], Outcome]) -> Check:
        """Run `body` as the check `name`: its Outcome is `ok`, a Warned
        `warn`, a Failed `fail`, a Skipped `skipped`; any other exception fails
        the check with its type and message (every later check still runs)."""
        started = time.perf_counter()
        try:
            out = body()
            status, detail, figures = "ok", out.detail, out.figures
        except Warned as w:
            status, detail, figures = "warn", str(w), w.figures
        except Failed as f:
            status, detail, figures = "fail", str(f), f.figures
        except Skipped as s:
            status, detail, figures = "skipped", str(s), {}
        except UserError as err:  # a config the check cannot use: its message names the setting
            status, detail, figures = "fail", str(err), {}
        except Exception as err:  # noqa: BLE001 - a check that breaks is a failed check, not a crashed preflight
            status, detail, figures = "fail", f"{type(err).__name__}: {err}", {}
        result = Check(name, status, time.perf_counter() - started, detail, figures)
        self.checks[name] = result
        self.show(result)
        return result

    def skip(self, name: str, why: str) -> Check:
        def body() -> Outcome:
            raise Skipped(why)
        return self.check(name, body)

    def status(self, name: str) -> Status | None:
        c = self.checks.get(name)
        return c.status if c else None

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks.values() if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        checks = {name: {"status": c.status, "seconds": round(c.seconds, 3), "detail": c.detail}
                  for name, c in sorted(self.checks.items(), key=lambda kv: _position(kv[0]))}
        figures: dict[str, Any] = {}
        for c in self.checks.values():
            figures.update(c.figures)
        return {"ok": not self.failed, "failed": self.failed, "checks": checks, **figures}


def _position(name: str) -> int:
    return ORDER.index(name) if name in ORDER else len(ORDER)
