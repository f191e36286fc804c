"""What Prefect + MLflow cost on top of the work itself, and how fast a fully
cached rerun is.

    python -m bench.pipeline            # smoke preset, about 5 minutes on 2 cores

One process, same machine, same work:
  (0) start-up of a temporary Prefect server (reported apart);
  (a) the smoke pipeline through the parent flow, as `gpt2 run` runs it
      (Prefect tasks and flows, MLflow runs, model registration);
  (b) the same four stages as plain `gpt2` library calls with tracking off,
      under a fresh root so nothing is cached;
  (c) (a) again on the same root: every stage cached.
Targets: (a)/(b) - 1 <= 10% once the server is up; (c) <= 20 s.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def library_path(preset: str, root: Path, work: Path) -> float:
    """The four stages as direct library calls, no orchestration, no tracking."""
    from gpt2.checkpoint.ref import resolve_checkpoint
    from gpt2.config.overrides import resolve_config
    from gpt2.data.prepare import prepare_data
    from gpt2.export.writer import export_checkpoint
    from gpt2.eval.evaluate import evaluate_checkpoint
    from gpt2.launch.torchrun import train_stage

    config = resolve_config(preset, {"runtime.work_dir": str(work), "tracking.enabled": False}, root=str(root))
    t0 = time.perf_counter()
    prepare_data(config, show_progress=False)
    train_stage(config)
    ref = resolve_checkpoint(config, "latest")
    evaluate_checkpoint(config, ref)
    export_checkpoint(ref, config.runtime.root, config.runtime.work_root)
    return time.perf_counter() - t0


def orchestrated_path(preset: str, root: Path, work: Path) -> tuple[float, dict]:
    from flows.pipeline import pipeline_flow

    t0 = time.perf_counter()
    result = pipeline_flow(preset, {"runtime.root": str(root), "runtime.work_dir": str(work)})
    return time.perf_counter() - t0, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["PREFECT_HOME"] = str(tmp / "prefect-home")  # a fresh server database
        t0 = time.perf_counter()
        server = SubprocessASGIServer()
        server.start(timeout=120)
        startup = time.perf_counter() - t0
        try:
            with temporary_settings({PREFECT_API_URL: server.api_url}):
                # Import cost (torch, prefect, mlflow, lm-eval) is paid once
                # here so neither measured path carries it.
                import flows.pipeline  # noqa: F401
                import gpt2.eval.evaluate  # noqa: F401

                direct = library_path(args.preset, tmp / "lib-root", tmp / "lib-work")
                orchestrated, result = orchestrated_path(args.preset, tmp / "root", tmp / "work")
                cached, again = orchestrated_path(args.preset, tmp / "root", tmp / "work")
        finally:
            server.stop()

    assert again["cached_stages"] == ["data", "train", "evaluate", "export"], again["cached_stages"]
    overhead = orchestrated / direct - 1
    print(f"{'temporary Prefect server start-up':<44} {startup:8.1f} s")
    print(f"{'(b) library calls, no orchestration':<44} {direct:8.1f} s")
    print(f"{'(a) gpt2 run path (Prefect + MLflow)':<44} {orchestrated:8.1f} s")
    print(f"{'(c) fully cached rerun':<44} {cached:8.1f} s")
    print(f"overhead (a)/(b) - 1: {overhead:+.1%}  (target <= +10%)")
    print(f"cached rerun: {cached:.1f} s  (target <= 20 s)")
    print(f"final val loss {result['final_val_loss']:.4f}, stages cached on rerun: {', '.join(again['cached_stages'])}")


if __name__ == "__main__":
    main()
