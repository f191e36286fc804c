"""`python` for the tests' trainer processes: hands `-m MODULE ...` (and,
when asked, `-c CODE ...`) to a warm server (tests/warm_python/server.py),
which forks a child that has already imported torch, MLflow and the trainer,
and then stands for that child: its signals are passed on, and it ends as the
child ended (the same exit code, or killed by the same signal). Anything else
(another module, a script, an option we do not mirror, an environment that
would change what an import did) runs the real interpreter in its place
(exec: same process, same arguments).

Started as `#!<python> -IS` (isolated, no site: a few milliseconds), with its
settings in warm.json beside it.
"""

import json
import os
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "warm.json")) as f:
    SETTINGS = json.load(f)
REAL = SETTINGS["python"]
# What the server already imported read these at import (or at library load):
# a child asked to run with other values gets a fresh interpreter instead.
# Not compared: what libraries add to os.environ for their own children and
# no import here reads (Dask's MALLOC_TRIM_THRESHOLD_ and MKL/OPENBLAS thread
# counts, scikit-learn's KMP_DUPLICATE_LIB_OK), and PYTHONHASHSEED (Dask's
# fixed value): the child keeps its server's random seed, so at most the order
# of a set of strings differs from a fresh process's.
IMPORT_TIME = ("OMP_", "GOMP_", "LD_", "PYTHON", "TORCHDYNAMO_", "TORCH_LOGS", "MPL")
HANDLED = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGTSTP, signal.SIGCONT)


def fresh(reason: str) -> None:
    if SETTINGS.get("log"):
        with open(SETTINGS["log"], "a") as log:
            log.write(json.dumps({"fresh": reason, "argv": sys.argv[1:6]}) + "\n")
    os.execv(REAL, [REAL, *sys.argv[1:]])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def parse(argv: list[str]) -> dict | None:
    """`[-u] [-B] -m MODULE ARGS` / `-c CODE ARGS` as the request; None for anything else."""
    request = {"unbuffered": False, "dont_write_bytecode": False, "module": None, "code": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c") or (arg.startswith("-") and arg[-1] in "mc" and set(arg[1:-1]) <= {"u", "B"}):
            flags, kind = arg[1:-1], arg[-1]
            rest = argv[i + 1:]
            if not rest:
                return None
            request["unbuffered"] |= "u" in flags
            request["dont_write_bytecode"] |= "B" in flags
            request["module" if kind == "m" else "code"] = rest[0]
            request["args"] = rest[1:]
            return request
        if not (arg.startswith("-") and len(arg) > 1 and set(arg[1:]) <= {"u", "B"}):
            return None
        request["unbuffered"] |= "u" in arg
        request["dont_write_bytecode"] |= "B" in arg
        i += 1
    return None


def main() -> None:
    request = parse(sys.argv[1:])
    if request is None:
        fresh("command line")
    if request["module"] is not None and request["module"] not in SETTINGS["modules"]:
        fresh("module")
    if request["code"] is not None and os.environ.get("WARM_PYTHON_C") != "1":
        fresh("code")
    # Every descriptor a fresh interpreter would inherit (stdio, and what the
    # parent passed on, e.g. multiprocessing's pipe), under the same numbers.
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                fds.append(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    env = dict(os.environ)
    for key in set(env) | set(SETTINGS["env"]):
        if key.startswith(IMPORT_TIME) and key not in HANDLED and env.get(key) != SETTINGS["env"].get(key):
            fresh(f"environment: {key}")
    # Ranks alternate between the servers, so two ranks of a run never share
    # a hash seed (a fresh interpreter each draws its own); with one server
    # (the quick tier, which keeps few runs of several ranks) a second rank
    # starts fresh instead.
    rank = env.get("LOCAL_RANK") or env.get("RANK")
    sockets = SETTINGS["sockets"]
    if len(sockets) == 1 and rank and rank.isdigit() and int(rank) > 0:
        fresh(f"rank {rank} beside a single warm server")
    path = sockets[(int(rank) if rank and rank.isdigit() else os.getpid()) % len(sockets)]
    # A server still importing is waited for (seconds): a fresh start costs more.
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline and alive(SETTINGS["servers"][path]):
        time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        fresh("server not ready")
    # A signal that comes before the child exists is passed on once it does.
    child: list[int] = []
    pending: list[int] = []

    def forward(signum, _frame) -> None:
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    request.update(env=env, cwd=os.getcwd(), fds=fds, proxy=os.path.abspath(__file__))
    socket.send_fds(conn, [json.dumps(request).encode()], fds)
    child.append(json.loads(conn.recv(1 << 16))["pid"])
    # Which process stands behind this proxy, for a test that signals or
    # names the trainer itself (tests.warm_python.running_pid); with this
    # proxy's start time, so a later proxy that reuses the pid is not misread.
    record = os.path.join(SETTINGS["children"], str(os.getpid()))
    with open("/proc/self/stat") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]
    with open(record + ".tmp", "w") as f:
        f.write(f"{child[0]} {started}")
    os.rename(record + ".tmp", record)
    for signum in pending:
        os.kill(child[0], signum)
    reply = conn.recv(1 << 16)
    if not reply:  # the server was stopped under its child
        sys.exit(1)
    outcome = json.loads(reply)
    if "signal" in outcome:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        if outcome["signal"] != signal.SIGKILL:  # (SIGKILL has no handler to reset)
            signal.signal(outcome["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), outcome["signal"])
    sys.exit(outcome["exit"])


main()
