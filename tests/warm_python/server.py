"""A warm interpreter: imports what the trainer's processes import (torch,
torch._dynamo, MLflow, matplotlib, the trainer and torchrun's agent; ~9 s of
CPU per process), then forks one child per request and runs in it what the
command line asked for (`-m MODULE ...` or `-c CODE ...`), with the
requester's own stdin/stdout/stderr, environment, working directory and
arguments. The child is a real process that runs the real module as
`__main__` and exits through the interpreter's normal shutdown (atexit,
non-daemon threads), so its exit code and signals are those of a fresh
`python -m MODULE`; only the imports are inherited instead of repeated.

    python -m tests.warm_python.server SOCKET

Protocol (AF_UNIX, SOCK_SEQPACKET, one connection per child): the proxy
(tests/warm_python/proxy.py) sends one JSON request (module or code, args,
-u/-B, env, cwd, the numbers of the descriptors it passes, its own path)
with every inheritable descriptor it has; the server answers {"pid": N}, and
when the child ends {"exit": CODE} or {"signal": N}. A connection that
closes first (its proxy was SIGKILLed) takes the child with it (SIGKILL), as
a killed interpreter would have taken itself.
"""

from __future__ import annotations

import fcntl
import gc
import io
import json
import os
import select
import signal
import socket
import sys

PRELOAD = [
    # What the trainer, torchrun's agent and the stage CLIs import at start.
    # Modules that are run as __main__ (gpt2.train.__main__, torch.distributed.run)
    # are not imported here: runpy would warn, and run them afresh anyway.
    "torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel",
    "torch.distributed.optim", "torch.distributed.launcher.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "mlflow", "mlflow.store.tracking.sqlalchemy_store", "mlflow.tracking",
    "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
    "gpt2.train.run", "gpt2.train.loop", "gpt2.tracking", "gpt2.launch.torchrun",
    "gpt2.launch.node", "gpt2.tokenizer", "gpt2.preflight.run",
]


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - an import the child will redo, and report, itself
            print(f"warm python: preloading {name} failed: {err}", file=sys.stderr)


def _warm_caches() -> None:
    """What every trainer builds on first use, built once here: the GPT-2
    encoding (gpt2.tokenizer caches it) and matplotlib's fonts, through one
    small figure drawn as the loss curve is (~1 s of CPU a trainer)."""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from gpt2.tokenizer import get_encoding

        get_encoding("gpt2")
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0], label="warm")
        ax.set_title("warm")
        ax.legend()
        fig.tight_layout()
        fig.savefig(io.BytesIO(), format="png", dpi=50)
        plt.close(fig)
    except Exception as err:  # noqa: BLE001 - a shortcut only: the child builds them itself
        print(f"warm python: warming caches failed: {err}", file=sys.stderr)


def _die_with_parent() -> None:
    """The server ends with the pytest worker that started it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def serve(path: str) -> tuple[dict, list[int], socket.socket]:
    """Accept requests until SIGTERM; returns (request, fds, connection) only in a forked child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # ready: clients connect only once it is
    children: dict[int, socket.socket] = {}
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while not stopping:
        ready, _, _ = select.select([listener, *children.values()], [], [], 0.05)
        for conn in ready:
            if conn is listener:
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 22, 250)
                if not msg:  # the proxy died between connecting and asking (a signal at its start): nothing to run
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children.values():
                        other.close()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    return json.loads(msg), fds, conn
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                try:
                    conn.send(json.dumps({"pid": pid}).encode())
                except OSError:  # the proxy is gone already: its child goes too (next turn), the server stays
                    _kill(pid)
            else:  # the proxy went away before its child: take the child with it, at once
                pid = next(p for p, c in children.items() if c is conn)
                try:
                    gone = not conn.recv(16)
                except OSError:  # reset: a proxy killed with our reply unread (seen once: it took the server down)
                    gone = True
                if gone:
                    _kill(pid)
                    os.waitpid(pid, 0)
                    children.pop(pid).close()
        _reap(children)
    for pid in children:
        _kill(pid)
    os.unlink(path)
    sys.exit(0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            outcome = {"signal": os.WTERMSIG(status)}
        else:
            outcome = {"exit": os.WEXITSTATUS(status)}
        try:
            conn.send(json.dumps(outcome).encode())
        except OSError:
            pass
        conn.close()


def _become(request: dict, fds: list[int], conn: socket.socket) -> None:
    """In the child: the requester's stdio, environment, directory, path and flags."""
    conn.close()
    # Out of the way first, then onto the numbers they had in the requester.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in zip(request["fds"], high):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = request["dont_write_bytecode"] or bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdin = sys.__stdin__ = _stream(0, "r", unbuffered)
    sys.stdout = sys.__stdout__ = _stream(1, "w", unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, "w", unbuffered, errors="backslashreplace")
    # sys.path as `python -m`/`-c` builds it: the working directory, then PYTHONPATH, then the rest.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in request["base_path"] if p not in extra]
    sys.path[:] = [os.getcwd() if request["module"] else "", *extra, *base]
    # What this child starts goes through the proxy too (torchrun's ranks; and
    # multiprocessing's spawned children where the requester asked for it).
    sys.executable = request["proxy"]
    if os.environ.get("WARM_PYTHON_C") == "1":
        import multiprocessing

        multiprocessing.set_executable(request["proxy"])


def _stream(fd: int, mode: str, unbuffered: bool, errors: str = "strict"):
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors=errors)
    buffered = raw if unbuffered else io.BufferedWriter(raw)
    interactive = os.isatty(fd)
    return io.TextIOWrapper(buffered, encoding="utf-8", errors=errors, write_through=unbuffered,
                            line_buffering=interactive or (fd == 2 and not unbuffered))


def _run(request: dict) -> None:
    import runpy

    if request["module"]:
        sys.argv = ["-m", *request["args"]]
        runpy._run_module_as_main(request["module"], alter_argv=True)  # what `python -m` calls
    else:
        import builtins
        import types

        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        sys.argv = ["-c", *request["args"]]
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)


def _shut_down() -> None:
    """What the interpreter does at exit before it tears itself down."""
    import atexit
    import threading

    threading._shutdown()  # non-daemon threads first, as at interpreter exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a stream closed: as at exit, nothing more to do
            pass


def _end_by_sigint() -> None:
    """As the interpreter ends after an uncaught KeyboardInterrupt: the
    traceback, the usual shutdown, then killed by SIGINT (a shell sees 130)."""
    import traceback

    traceback.print_exc()
    _shut_down()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _end(code: object) -> None:
    """As the interpreter ends with SystemExit(code), minus its teardown:
    freeing every module touches every preloaded object's count, copying
    the server's heap page by page (~0.5 s a child). Finalizers that matter
    at exit (weakref.finalize, logging's flush) run from atexit, as before."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    _shut_down()
    os._exit(status)


if __name__ == "__main__":
    _die_with_parent()
    # The server's own sys.path, without its first entry (the directory it was
    # started in), is what a fresh interpreter would add after PYTHONPATH.
    BASE = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    _preload()
    _warm_caches()
    # Every child ends with the interpreter's final collection, and any
    # gen-2 collection walks every object: over the preloaded modules' heap
    # that was ~3 s a child, most of it copying the pages that each object's
    # GC header sits on. Frozen, the preloaded objects are left out of both.
    gc.collect()
    gc.freeze()
    request, fds, conn = serve(sys.argv[1])
    request["base_path"] = BASE
    _become(request, fds, conn)
    del request["base_path"], BASE, fds, conn
    try:
        _run(request)
    except KeyboardInterrupt:
        _end_by_sigint()
    except SystemExit as stop:
        _end(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        _end(1)
    _end(0)
