"""The logging setup of the stack's Prefect server: Prefect's own, plus the
automations' triggers and actions at INFO, which say each time a trigger
takes up an event and each time an action is taken (`Changing flow run
state`); the server's other loggers stay at Prefect's WARNING.

Why: the fault soak once saw a pipeline's Crashed event stored and the
reschedule automation never act on it (docs/fault-soak.md); the stack's
rescheduler now puts such a run back, but the server's log said nothing of
what the trigger did. With these lines, `logs/server.log` tells the next
time whether the trigger saw the event at all."""

from __future__ import annotations

import os
from pathlib import Path

LOGGERS = ("prefect.server.events.triggers", "prefect.server.events.actions")
FILE = "prefect-server-logging.yml"
_LOGGERS = "\nloggers:\n"


def write(state_dir: Path) -> Path | None:
    """Write the setup beside the stack's database; its path, for
    PREFECT_LOGGING_SETTINGS_PATH. None where Prefect's own file is not laid
    out as expected (a later Prefect): the server then keeps Prefect's."""
    import prefect

    text = (Path(prefect.__file__).parent / "logging" / "logging.yml").read_text()
    if text.count(_LOGGERS) != 1:
        return None
    # Prefect fills in its ${SETTINGS} when it loads the file, as it does its own.
    ours = "".join(f"  {name}:\n    level: INFO\n\n" for name in LOGGERS)
    text = text.replace(_LOGGERS, _LOGGERS + ours, 1)
    path = state_dir / FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
