"""Stage flow `gpt2-data`: download → tokenize → shard → upload, cached.

    gpt2 prepare --preset smoke                       # via the CLI
    python -m flows.data --preset smoke               # the flow directly

A rerun with the same data identity finds every task Cached. If the data
directory under the root is incomplete or damaged, each step's outputs are
checked and only what is missing is rebuilt.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from gpt2 import storage
from gpt2.config import Config
from gpt2.data import prepare
from gpt2.data.manifest import load_manifest, manifest_url
from gpt2.data.shards import ShardError
from gpt2.overrides import resolve_config
from tasks.common import bind, run_cached
from tasks.data import download, shard, tokenize, upload


def _complete(config: Config) -> bool:
    try:
        prepare.summarize(manifest_url(config))
        return True
    except (FileNotFoundError, ShardError) as err:
        if storage.exists(manifest_url(config)):
            get_run_logger().warning("existing data is damaged, rebuilding what is missing: %s", err)
        return False


def run_data_stage(config: Config) -> dict[str, Any]:
    """The four tasks; returns the prepare summary plus `cached`."""
    storage.check_writable(storage.normalize_url(config.runtime.root))
    complete = _complete(config)
    # Data already complete: plain cached calls. Otherwise check each step's
    # outputs and recompute a step whose cached result lost its files.
    check = (lambda _: True) if complete else None
    steps = {}
    src, steps["download"] = run_cached(download, config, valid=check or prepare.source_ok)
    tok, steps["tokenize"] = run_cached(tokenize, config, src, valid=check or prepare.tokenized_ok)
    loc, steps["shard"] = run_cached(shard, config, tok, valid=check or prepare.local_shards_ok)
    if complete:
        url, steps["upload"] = run_cached(upload, config, loc, src)
    else:  # the root lacks (part of) the result: upload again, whatever the cache says
        url, steps["upload"] = bind(upload, config, refresh=True)(config, loc, src), False
    result = prepare.summarize(url).model_dump()
    result["cached"] = all(steps.values())
    result["cached_steps"] = sorted(k for k, v in steps.items() if v)
    _shard_table(url)
    return result


def _shard_table(url: str) -> None:
    manifest = load_manifest(url)
    rows = [
        {"shard": s.path, "split": s.split, "tokens": s.tokens, "bytes": s.bytes, "sha256": s.sha256[:16]}
        for s in manifest.shards
    ]
    create_table_artifact(table=rows, key="data-shards", description=f"Shards of {manifest.name} at {url}")


@flow(name="gpt2-data", log_prints=False)
def data_flow(preset: str = "smoke", overrides: dict[str, Any] | None = None, root: str | None = None) -> dict[str, Any]:
    """Prepare llm.c shards for a preset plus dotted-key overrides."""
    config = resolve_config(preset, overrides or {}, root=root)
    get_run_logger().info("data stage: source %s -> %s", config.data.source, manifest_url(config))
    return run_data_stage(config)


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--root", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    print(json.dumps(data_flow(args.preset, {}, args.root)))


if __name__ == "__main__":
    main()
