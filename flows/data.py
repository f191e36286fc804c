"""Stage flow `gpt2-data`: download → tokenize → shard → upload, cached.

    gpt2 prepare --preset smoke                       # via the CLI
    python -m flows.data --preset smoke               # the flow directly

A rerun with the same data identity finds every task Cached. If the data
directory under the root is incomplete or damaged, each step's outputs are
checked and only what is missing is rebuilt.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from flows.entry import flow_main
from flows.stages import publish_result
from gpt2.config.identity import data_fingerprint
from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data.disk import remove_intermediates
from gpt2.data.download import download_ok, resolve_source
from gpt2.data.llmc import ShardError
from gpt2.data.manifest import load_manifest
from gpt2.data.prepare import summarize
from gpt2.data.shard import local_shards_ok
from gpt2.data.tokenized import tokenized_ok
from gpt2.root import layout, storage
from gpt2.root.checks import check_writable
from tasks.common import bind, run_cached
from tasks.data import download, shard, tokenize, upload
from tasks.data_cluster import check_cluster, workers_read_source
from tasks.tracking import finished_stage_run, stage_run


def _complete(config: Config) -> bool:
    try:
        summarize(layout.manifest(config))
        return True
    except (FileNotFoundError, ShardError) as err:
        if storage.exists(layout.manifest(config)):
            get_run_logger().warning("existing data is damaged, rebuilding what is missing: %s", err)
        return False


def run_data_stage(config: Config) -> dict[str, Any]:
    """The four tasks; returns the prepare summary plus `cached`."""
    check_writable(layout.root(config))
    complete = _complete(config)
    if not complete:
        check_cluster(config)  # a wrong runtime.data_cluster fails here, before any work
    # Data already complete: plain cached calls. Otherwise check each step's
    # outputs and recompute a step whose cached result lost its files.
    check = (lambda _: True) if complete else None
    steps = {}
    if workers_read_source(config):
        src = resolve_source(config.data)  # the cluster's workers stream their own units
    else:
        src, steps["download"] = run_cached(download, config, valid=check or (lambda s: download_ok(config, s)))
    tok, steps["tokenize"] = run_cached(tokenize, config, src, valid=check or tokenized_ok)
    remove_intermediates(config, "tokenize")  # what runtime.keep_intermediate does not keep
    loc, steps["shard"] = run_cached(shard, config, tok, valid=check or local_shards_ok)
    remove_intermediates(config, "shard")
    if complete:
        url, steps["upload"] = run_cached(upload, config, loc, src)
    else:  # the root lacks (part of) the result: upload again, whatever the cache says
        url, steps["upload"] = bind(upload, config, refresh=True)(config, loc, src), False
    remove_intermediates(config, "upload")
    storage.remove(layout.unit_staging_dir(config), recursive=True)  # a cluster's units: the shards are safe now
    result = summarize(url).model_dump()
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


def data_run_name(config: Config) -> str:
    """The MLflow run name of a data result: one run per dataset identity."""
    return f"data-{config.data.name}-{data_fingerprint(config)[:12]}"


def track_data_stage(config: Config, result: dict[str, Any], parent_run_id: str | None) -> str | None:
    """One MLflow run per data result: the data config, token counts,
    manifest. A cached result answers with the run that recorded it."""
    name = data_run_name(config)
    if result["cached"] and (earlier := finished_stage_run(config, name, "data")):
        get_run_logger().info("data stage cached: its MLflow run is %s", earlier)
        return earlier
    tags = {"cached": str(result["cached"]).lower()}
    with stage_run(config, name, "data", parent_run_id, tags=tags) as tracker:
        tracker.log_params({"data": config.data.model_dump(mode="json")})
        tracker.log_metrics({f"data/{k}": result[k] for k in ("total_tokens", "train_tokens", "val_tokens",
                                                              "shards", "documents")}, step=0)
        tracker.log_dict(load_manifest(result["manifest"]).model_dump(mode="json"), "manifest.json")
        return tracker.run_id


@flow(name="gpt2-data", log_prints=False)
def data_flow(preset: str = "smoke", overrides: dict[str, Any] | None = None, root: str | None = None,
              parent_run_id: str | None = None) -> dict[str, Any]:
    """Prepare llm.c shards for a preset plus dotted-key overrides."""
    config = resolve_config(preset, overrides or {}, root=root)
    get_run_logger().info("data stage: source %s -> %s", config.data.source, layout.manifest(config))
    result = run_data_stage(config)
    result["mlflow_run_id"] = track_data_stage(config, result, parent_run_id)
    publish_result(config, result)
    return result


def main() -> None:
    flow_main(data_flow, __doc__)


if __name__ == "__main__":
    main()
