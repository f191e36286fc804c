"""Training across machines: torchrun's c10d rendezvous.

With `runtime.nnodes` N > 1 every machine starts the same command; torchrun
joins them at `runtime.rdzv_endpoint` (host:port of one of them, which
serves the rendezvous) and numbers the N × nproc_per_node processes. The
run's name is the rendezvous id, so every machine derives the same id from
the same config and a second run cannot join by mistake.

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=node0:29500 --rdzv-id=RUN -m gpt2.train --config run.json

Rank roles across machines are those of one machine: global rank 0 holds the
lease and writes checkpoints and MLflow; each machine's local rank 0 does its
machine's work (fetching shards into its own work dir); the stop flags ride
on the loss all-reduce, so a SIGTERM on any machine stops all of them after
the same step.
"""

from __future__ import annotations

import logging
import re

from gpt2.config.tree import Config
from gpt2.errors import UserError
from gpt2.root import layout

log = logging.getLogger(__name__)

_ENDPOINT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


class RendezvousError(UserError):
    """runtime.nnodes / runtime.rdzv_endpoint do not describe a rendezvous."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) as (host, port)."""
    match = _ENDPOINT.match(endpoint.strip())
    port = int(match["port"]) if match else 0
    if not match or not 1 <= port <= 65535:
        raise RendezvousError(
            f"runtime.rdzv_endpoint={endpoint!r} is not host:port: give the address every node can reach "
            "and a free port of the node that serves the rendezvous, e.g. runtime.rdzv_endpoint=node0:29500")
    return match["host"], port


def check(config: Config) -> None:
    """Refuse a multi-node config that cannot rendezvous; warn about a local root."""
    rt = config.runtime
    if rt.nnodes == 1:
        return
    if not rt.rdzv_endpoint:
        raise RendezvousError(
            f"runtime.nnodes={rt.nnodes} needs runtime.rdzv_endpoint (host:port where the nodes meet, e.g. "
            "node0:29500; on Kubernetes the training flow sets it); or train on one machine with runtime.nnodes=1")
    parse_endpoint(rt.rdzv_endpoint)
    warn_unshared_root(config)


def warn_unshared_root(config: Config) -> None:
    """Said, not refused: a local root may be shared storage, which cannot be told from here."""
    rt = config.runtime
    if rt.nnodes > 1 and layout.local_root(config) is not None:
        log.warning("runtime.nnodes=%d with the local root %s: every node reads the shards there and global "
                    "rank 0, which may be on any node, writes the checkpoints there; this only works if it is "
                    "storage all nodes share at the same path (NFS, a shared volume), else use a gs:// or s3:// "
                    "root", rt.nnodes, layout.root(config))


def rdzv_id(config: Config) -> str:
    """The same on every node for the same run (torchrun's --rdzv-id)."""
    return layout.run_name(config)


def rendezvous_args(config: Config, is_host: bool | None = None) -> list[str]:
    """torchrun's flags for this config's nodes: `--standalone` for one node,
    the c10d rendezvous for several (check(config) first). `is_host`: whether
    this node serves the rendezvous, where its own name may not match the
    endpoint's (a pod behind a Service); None lets torchrun compare the names."""
    rt = config.runtime
    if rt.nnodes == 1:
        return ["--standalone"]
    args = [f"--nnodes={rt.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rt.rdzv_endpoint.strip()}",
            f"--rdzv-id={rdzv_id(config)}"]
    return args + [f"--rdzv-conf={','.join(f'{k}={v}' for k, v in rdzv_conf(config, is_host).items())}"]


def rdzv_conf(config: Config, is_host: bool | None = None) -> dict[str, str]:
    """torchrun's --rdzv-conf: both of c10d's waits from runtime.rdzv_timeout_s.
    `read_timeout` (torch's default 60 s) is how long a node's connection to
    the store on the serving node waits, per try: a node that starts minutes
    before the one serving the rendezvous (a cold cluster: nodes autoscaled,
    images pulled) fails with RendezvousConnectionError without it.
    `join_timeout` (600 s) is how long the server waits for all nodes."""
    seconds = str(max(1, int(config.runtime.rdzv_timeout_s)))
    conf = {"read_timeout": seconds, "join_timeout": seconds}
    if is_host is not None:
        conf["is_host"] = str(is_host).lower()
    return conf


def world_size(config: Config, nproc: int) -> int:
    """Processes over all nodes: what the global batch must split over."""
    return config.runtime.nnodes * nproc
