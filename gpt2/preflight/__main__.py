"""`python -m gpt2.preflight` (and `gpt2 preflight`): prove on the machine that
will train, in minutes, that this config and this root will finish the run,
or say exactly why not, before the run spends on it.

    python -m gpt2.preflight --preset gpt2-124m --root gs://bucket/gpt2
    python -m gpt2.preflight --preset gpt2-124m --synthetic --record   # no data at hand: random tokens
    torchrun --nnodes=2 --nproc_per_node=8 ... -m gpt2.preflight --preset gpt2-124m   # on each node

Several GPUs on this machine: it starts itself under torchrun, one process
per GPU, as `gpt2 train` does. It needs only what the trainer core needs
(no Prefect, MLflow or typer); a check whose package is missing says
`skipped`. Exit 0 when no check failed, 1 when one did, 2 on a bad config.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpt2.preflight.report import Check
from gpt2.process import collector
from gpt2.report import figures_on_record
from gpt2.secrets import redact

log = logging.getLogger("gpt2.preflight")


def parse(argv: list[str] | None) -> argparse.Namespace:
    from gpt2.config.presets import PRESETS
    from gpt2.preflight.run import DEFAULT_STEPS, JOIN_TIMEOUT_S

    p = argparse.ArgumentParser(prog="gpt2 preflight", description=__doc__.splitlines()[0])
    p.add_argument("--preset", "-p", default="smoke", help=f"named preset: {', '.join(PRESETS)}")
    p.add_argument("--set", "-s", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as for gpt2 train (repeatable)")
    p.add_argument("--root", help="artifact root URL (default runtime.root)")
    p.add_argument("--config", type=Path, help="a full config JSON instead of --preset/--set/--root "
                   "(gpt2 config show > run.json; how the training flow runs it)")
    p.add_argument("--json", dest="as_json", action="store_true", help="print one JSON object as stdout's last line")
    p.add_argument("--record", action="store_true",
                   help="on a GPU, append the figures to bench/results.jsonl (in a checkout)")
    p.add_argument("--synthetic", action="store_true",
                   help="random tokens for the steps and no data check (a machine without the prepared root)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps after the first (which compiles)")
    p.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT_S,
                   help="seconds rank 0 waits for every rank to join")
    p.add_argument("--verbose", action="store_true", help="the trainer core's log lines too")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    return args


def _stop_on_sigterm() -> None:
    """SIGTERM ends the preflight like Ctrl-C: through `finally`, so its probe
    object under the root is removed (Python's default would end at once)."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def _torchrun(nproc: int, argv: list[str]) -> int:
    """This command again under torchrun, one process per GPU; its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "gpt2.preflight", *argv]
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()  # torchrun passes it on to every rank, which removes its probe
        proc.wait()
        raise


def _show(stream):
    def show(check: Check) -> None:
        print(check.line(), file=stream, flush=True)
    return show


def _record(config, result: dict) -> str | None:
    """The figures as a bench/results.jsonl record (GPU runs only)."""
    import torch

    if result.get("gpus", 0) < 1:
        return None
    if not figures_on_record.RESULTS.parent.is_dir():
        return f"--record needs a checkout ({figures_on_record.RESULTS}); run it from the repository's root"
    statuses = {name: c["status"] for name, c in result["checks"].items()}
    figures = {k: v for k, v in result.items() if k not in ("checks", "ok", "failed")}
    record = figures_on_record.figures_record("preflight", torch.cuda.get_device_name(0), torch.__version__,
                                              {"preset": config.preset, "statuses": statuses, **figures})
    figures_on_record.append(record)
    return f"recorded in {figures_on_record.RESULTS}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    from pydantic import ValidationError

    from gpt2.config.overrides import ConfigError, resolve_config
    from gpt2.config.tree import Config

    try:
        config = (Config.model_validate(json.loads(args.config.read_text())) if args.config else
                  resolve_config(args.preset, args.sets, root=args.root))
    except (ConfigError, ValidationError, OSError, ValueError) as err:
        print(f"error: {redact(str(err))}", file=sys.stderr)
        return 2
    if "WORLD_SIZE" not in os.environ:
        from gpt2.process.distributed import resolve_nproc, visible_gpus

        if config.runtime.nnodes > 1:
            print(f"error: runtime.nnodes={config.runtime.nnodes}: start the preflight on every node as the run "
                  "starts, under torchrun with the same --nnodes, --nproc_per_node and rendezvous endpoint "
                  "(torchrun ... -m gpt2.preflight ...)", file=sys.stderr)
            return 2
        nproc = resolve_nproc(config.runtime.nproc_per_node, visible_gpus(config.runtime.device))
        if nproc > 1:
            return _torchrun(nproc, argv)
    _stop_on_sigterm()
    from gpt2.preflight.run import preflight

    collector.freeze_imports()  # where `python -m gpt2.preflight` paused the collector (below)
    collector.started()

    out = sys.stderr if args.as_json else sys.stdout
    if rank == 0:
        print(f"preflight of {config.preset} for root {redact(config.runtime.root)}"
              + (" (--synthetic: random tokens, the data is not checked)" if args.synthetic else ""), file=out)
    report = preflight(config, synthetic=args.synthetic, steps=args.steps, join_timeout_s=args.join_timeout,
                       show=_show(out))
    if rank != 0:
        return 1 if report.failed else 0
    result = report.to_dict()
    counts = {s: sum(c["status"] == s for c in result["checks"].values()) for s in ("ok", "warn", "fail", "skipped")}
    verdict = ("this machine can run it" if not report.failed else
               f"this machine cannot run it as configured: fix {', '.join(report.failed)}")
    print(f"preflight: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} failed, {counts['skipped']} "
          f"skipped: {verdict}", file=out)
    if args.record:
        note = _record(config, result)
        print(note or "--record: CPU runs are never recorded", file=out)
    if args.as_json:
        print(json.dumps(result, default=str))
    return 1 if report.failed else 0


if __name__ == "__main__":
    collector.pause()  # its imports without full collections (gpt2.process.collector), until main() has them
    collector.freeze_at_exit()
    sys.exit(main())
