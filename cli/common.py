"""Options and output helpers shared by every `gpt2` sub-command."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from flows.summary import SUMMARY_RECORD
from gpt2.config.overrides import ConfigError, resolve_config
from gpt2.config.presets import PRESETS
from gpt2.config.tree import Config
from gpt2.process import signals
from gpt2.secrets import redact

PresetOpt = typer.Option("smoke", "--preset", "-p", help=f"Named preset: {', '.join(PRESETS)}.")
SetOpt = typer.Option(None, "--set", "-s", help="Override a config key, e.g. --set train.max_steps=100 (repeatable).")
RootOpt = typer.Option(None, "--root", help="Artifact root URL (file://…, gs://…, s3://…); default runtime.root.")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object as the last line of stdout.")
GridOpt = typer.Option(None, "--grid", help="A sweep: one member per value, e.g. --grid train.lr=3e-4,6e-4; several "
                       "--grid make their Cartesian product (values read as --set values).")
RunsFileOpt = typer.Option(None, "--runs", help="A sweep: a YAML or JSON file listing the members' override sets, e.g. "
                           "[{train.lr: 3.0e-4}, {train.optimizer: muon}] (crossed with --grid when both are given).")
VerboseOpt = typer.Option(False, "--verbose", help="Show the traceback of a user error on stderr too (it always goes "
                          "to the log file the error line names).")


def load_config(preset: str, sets: Optional[list[str]], root: Optional[str]) -> Config:
    """Resolve the config or exit 2 with every problem listed."""
    try:
        return resolve_config(preset, sets or [], root=root)
    except ConfigError as err:
        fail(str(err), code=2)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted, so a caller
    that swaps stderr (a test runner, an embedding app) never gets a handler
    holding a closed stream."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(verbose: bool = False) -> None:
    # Logs on stderr keep stdout clean for --json consumers.
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    # Every request to the Prefect API is logged at INFO by httpx: noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)


_at_exit: list[str] | None = None  # the `error:` lines kept for the end (defer_errors_to_exit)


def defer_errors_to_exit() -> None:
    """For the command's own process (cli.main): the `error:` line is printed
    as the process ends, after Prefect has logged its temporary server's
    shutdown (its exit handler is registered later, so it runs first), so it
    is the last line on stderr, where a user and a script look for it."""
    global _at_exit
    import atexit

    _at_exit = []
    atexit.register(_print_errors, _at_exit)


def _print_errors(lines: list[str]) -> None:
    for line in lines:
        typer.secho(line, err=True, fg=typer.colors.RED)


def fail(message: str, code: int = 1) -> None:
    line = f"error: {redact(message)}"
    # After SIGTERM Prefect may end the process by the signal itself, which
    # runs no exit handler: that line goes out at once.
    if _at_exit is not None and code != 143:
        _at_exit.append(line)
    else:
        _print_errors([line])
    raise typer.Exit(code)


def emit(result: dict[str, Any], as_json: bool, human: str) -> None:
    """Print a human summary, or the result as the final stdout line."""
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        typer.echo(human)


def prefect_env() -> None:
    """Defaults for running flows from the CLI: no telemetry (there may be no
    network, and it can lock the SQLite database); a user's settings win."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    # Prefect waits 20 s for its temporary server, which a busy 2-core machine
    # can miss (migrations, then uvicorn): a generous wait costs nothing when the
    # server is quick, and the run is not lost to a start-up race.
    os.environ.setdefault(SERVER_WAIT_SETTING, str(SERVER_WAIT_S))
    temporary_server_outlives_ctrl_c()


def temporary_server_outlives_ctrl_c() -> None:
    """Prefect's temporary server starts in a session of its own, so a
    terminal's Ctrl-C (SIGINT to the whole foreground process group) reaches
    the command and its trainer but not the server their flows report to: it
    stays up while they stop (a checkpoint, the runs' final states) and is
    stopped last, by Prefect's own exit handler, as on any other exit; if
    this process dies without one (SIGKILL), the server is told to stop."""
    import subprocess

    from prefect.server.api import server

    from gpt2.process.signals import terminate_with_parent

    run = server.SubprocessASGIServer._run_uvicorn_command
    if getattr(run, "own_session", False):
        return

    def in_own_session(self):
        # Out of the terminal's process group, so tied to this process another way: it gets SIGTERM
        # when we die, even by SIGKILL or a closed terminal's SIGHUP, and never outlives us.
        popen = subprocess.Popen
        subprocess.Popen = functools.partial(popen, start_new_session=True, preexec_fn=terminate_with_parent)
        try:
            return run(self)
        finally:
            subprocess.Popen = popen

    in_own_session.own_session = True
    server.SubprocessASGIServer._run_uvicorn_command = in_own_session


def check_root(config: Config) -> str | None:
    """The root, checked in about a second before any server starts: one
    that does not answer is named and ends the command; one that cannot be
    written returns why (flows.read_only answers finished work from it)."""
    from gpt2.root import layout, storage
    from gpt2.root.checks import check_not_a_file, check_reachable, check_writable

    root = layout.root(config)
    if root.startswith("memory://"):  # this process's own: nothing to ask
        return None
    if root not in _ROOT_CHECKED:
        try:
            if root.startswith("file://"):
                check_not_a_file(root)
            else:
                check_reachable(root)
        except storage.StorageError as err:
            fail(str(err))
        try:
            check_writable(root)
            _ROOT_CHECKED[root] = None
        except storage.StorageError as err:
            cause = err.__cause__ or err
            _ROOT_CHECKED[root] = (f"artifact root {redact(root)} is not writable "
                                   f"({type(cause).__name__}: {redact(str(cause))})")
    return _ROOT_CHECKED[root]


_ROOT_CHECKED: dict[str, str | None] = {}  # root -> why it cannot be written; a command asks once


def announce_server() -> str | None:
    """The one line a command prints first when its flows go to a running
    Prefect server rather than a temporary one of its own: which server, and
    why (the environment, or a profile such as `gpt2 stack up`'s), since runs,
    logs and results then land there. None (and nothing printed) otherwise."""
    import os

    from prefect.context import get_settings_context

    from cli.stack.prefect_setup import PROFILE

    context = get_settings_context()
    url = context.settings.api.url
    if not url:
        return None
    if os.environ.get("PREFECT_API_URL"):
        why = "$PREFECT_API_URL is set"
    else:
        profile = context.profile.name
        why = (f"the Prefect profile {profile!r} is active (`gpt2 stack up` made it; `gpt2 stack down` switches back)"
               if profile == PROFILE else f"the Prefect profile {profile!r} sets PREFECT_API_URL")
    line = f"using the Prefect server at {redact(url)}: {why}"
    typer.echo(line, err=True)
    return line


def temporary_server_database(config: Config) -> None:
    """Prefect's temporary server (no PREFECT_API_URL) keeps its run history
    in the work dir, `<work dir>/prefect.db`, beside this project's other
    scratch, instead of `~/.prefect/prefect.db` (docs/getting-started.md, "What lives where"):
    unless a server or a database of the user's own is configured. A new one
    starts as a migrated copy (cli.stack.services.seed_prefect_db)."""
    import os

    from prefect.settings import get_current_settings

    from cli.stack.services import seed_prefect_db

    settings = get_current_settings()
    url = settings.server.database.connection_url
    if settings.api.url or (url and url.get_secret_value() != f"sqlite+aiosqlite:///{settings.home}/prefect.db"):
        return
    path = config.runtime.work_root / "prefect.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    seed_prefect_db(path)
    os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{path}"


TEMPORARY_SERVER_QUICK_START = {"PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
                                "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}
"""Prefect's temporary server registers no block types as it starts. Registering them first imports
every installed Prefect collection (prefect-gcp's Vertex AI and BigQuery clients, prefect-kubernetes,
prefect-dask), ~4.5 s of CPU for a server that lives as long as one command; memoizing it does not
help, as the memo is checked after the imports. A run saves only gpt2's own blocks (its results
storage, the compile secret), and saving a block registers its type."""


def temporary_server_quick_start() -> None:
    """TEMPORARY_SERVER_QUICK_START, where this command's flows will start Prefect's temporary
    server (no PREFECT_API_URL); a value the user set wins."""
    import os

    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return
    for name, value in TEMPORARY_SERVER_QUICK_START.items():
        os.environ.setdefault(name, value)


SERVER_WAIT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
SERVER_WAIT_S = 180


def server_start_failure(err: BaseException) -> str | None:
    """The message for Prefect's temporary server not answering in time: what
    happened, how long it waited, and the setting to raise; None for any
    other error."""
    import os

    text = str(err)
    if "ephemeral Prefect API server" not in text:
        return None
    waited = os.environ.get(SERVER_WAIT_SETTING, "20")
    return (f"Prefect's temporary API server did not answer within {waited} s ({text.splitlines()[0][:300]}). "
            f"On a busy machine raise {SERVER_WAIT_SETTING} (e.g. {SERVER_WAIT_SETTING}=600), or point "
            "PREFECT_API_URL at a running server (`gpt2 stack up`)")


def user_errors() -> tuple[type[Exception], ...]:
    """Errors caused by input or environment, each with a message naming the bad
    thing and what to do: shown as one line, not a traceback."""
    from gpt2.errors import UserError

    return (UserError, FileNotFoundError)


def _read_only_answer(entrypoint: str, config: Config, why: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    from flows.read_only import answer
    from gpt2.errors import UserError

    try:
        result = answer(entrypoint, config, why, **kwargs)
    except UserError as err:
        fail(str(err))
    typer.echo(f"{why}: answered from what it holds (no server, no lease, nothing written)", err=True)
    return result


class _HideUserTraceback:
    """A console handler's `format`, minus the traceback of a user error (the
    message names the bad thing; a traceback is for bugs): the record keeps it
    for every other handler (Prefect's API log, the log file)."""

    def __init__(self, original, log_file: Path):
        self.original, self.log_file, self.hidden = original, log_file, False

    def __call__(self, record: logging.LogRecord) -> str:
        exc = record.exc_info
        if not (exc and isinstance(exc[1], user_errors())):
            return self.original(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            self.hidden = True
            return self.original(record) + f" (traceback in {self.log_file})"
        finally:
            record.exc_info, record.exc_text = saved


_LOG_FILE: list[Path] = []  # where this command's full log goes, once run_flow has set it up

ASKED_STOP = "aborted by an interrupt signal"
"""How Prefect's engine words a run it ended on KeyboardInterrupt ("Crash detected! Execution was
aborted by an interrupt signal."), at ERROR level, once for every flow and task run it was in."""


def _console_shows(record: logging.LogRecord) -> bool:
    """A console handler's filter; the log file keeps every record. After the user's Ctrl-C,
    Prefect's red crash lines for it are not shown (the run is still Crashed, for the automations):
    the command's own last line says what was kept; any other error still shows. The pipeline's
    summary is not shown as a log line: the command prints it itself, once."""
    if getattr(record, SUMMARY_RECORD, False):
        return False
    return not (record.levelno >= logging.ERROR and signals.requested() and ASKED_STOP in record.getMessage())


def log_to_file(config: Config, verbose: bool) -> Path:
    """Every log record of this command, tracebacks included, to
    `<work dir>/logs/gpt2-<time>-<pid>.log`; unless `verbose`, user errors reach
    the console as their message alone."""
    import os
    import time

    directory = config.runtime.work_root / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"gpt2-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    for console in root.handlers:
        if isinstance(console, logging.StreamHandler) and not isinstance(console, logging.FileHandler):
            console.addFilter(_console_shows)
            if not verbose:
                console.format = _HideUserTraceback(console.format, path)
    _LOG_FILE[:] = [path]
    return path


def run_flow(entrypoint: str, preset: str, sets: Optional[list[str]], root: Optional[str],
             errors: tuple[type[Exception], ...] | None = None, verbose: bool = False,
             **kwargs: Any) -> tuple[Config, dict[str, Any]]:
    """Resolve the config (exit 2 listing every problem), then run the flow at
    `module:function` in this process; an error of `errors` (default: the user
    errors) exits 1 with its message. The root travels as the
    `runtime.root` override, which every flow, the parent included, accepts."""
    import importlib

    from gpt2.config.overrides import parse_assignments

    config = load_config(preset, sets, root)
    setup_logging()
    unwritable = check_root(config)
    if unwritable:
        return config, _read_only_answer(entrypoint, config, unwritable, kwargs)
    prefect_env()
    signals.watch()  # a Ctrl-C is kept in mind even where Prefect swallows it (gpt2.process.signals)
    announce_server()
    temporary_server_database(config)
    temporary_server_quick_start()
    module, name = entrypoint.split(":")
    flow_fn = getattr(importlib.import_module(module), name)
    log_to_file(config, verbose)  # after the import: Prefect has set up its console handler by then
    overrides, _ = parse_assignments(sets or [])
    overrides["runtime.root"] = config.runtime.root
    from prefect.exceptions import TerminationSignal

    try:
        return config, flow_fn(preset=preset, overrides=overrides, **kwargs)
    except TerminationSignal:  # SIGTERM: Prefect marked the run Crashed once the trainer had checkpointed
        fail("stopped by SIGTERM; work done so far is kept (training wrote a checkpoint): rerun the same command "
             "to continue", code=143)
    except KeyboardInterrupt:  # Ctrl-C: the trainer checkpointed (if it was training) before we got here
        signals.stopped()
        fail("stopped by Ctrl-C; work done so far is kept (finished stages, shards, the training checkpoint): "
             "rerun the same command to continue", code=130)
    except Exception as err:
        message = server_start_failure(err)
        if message is not None:
            fail(message)
        if not isinstance(err, errors or user_errors()):
            raise
        known = isinstance(err, user_errors())  # their messages already say what and where
        fail(str(err) if known else f"{type(err).__name__}: {err}")
