"""Stage flow `gpt2-export`: a checkpoint as a Hugging Face directory and
llm.c files under the run, the HF model registered in MLflow; cached.

    gpt2 export --preset smoke --json                  # via the CLI
    python -m flows.export --preset smoke              # the flow directly
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.entry import flow_main
from flows.stages import publish_result
from gpt2.checkpoint.ref import resolve_checkpoint
from gpt2.config.overrides import resolve_config
from gpt2.config.tree import Config
from gpt2.data.epoch import steps_for_checkpoint
from gpt2.export.writer import export_complete
from gpt2.root import layout
from gpt2.root.checks import check_writable
from gpt2.weights.init import with_resolved_init
from tasks.common import run_cached
from tasks.export import export_checkpoint, register_model
from tasks.registry import model_version_exists


def _registered(config: Config):
    def check(result: dict[str, Any]) -> bool:
        return model_version_exists(config, result["registered_model"], result["model_version"])

    return check


def run_export_stage(config: Config, checkpoint: str | None = "latest", parent_run_id: str | None = None) -> dict[str, Any]:
    """Export and register; returns the export paths, the registry entry and `cached`."""
    ref = resolve_checkpoint(config, checkpoint)
    check_writable(layout.root(config))
    get_run_logger().info("exporting %s", ref.url)
    export, c1 = run_cached(export_checkpoint, config, ref,
                            valid=lambda r: export_complete(r["export_dir"], ref, config.runtime.root))
    entry, c2 = run_cached(register_model, config, ref, export, parent_run_id, valid=_registered(config))
    return {**export, **entry, "cached": c1 and c2}


@flow(name="gpt2-export", log_prints=False)
def export_flow(
    preset: str = "smoke",
    overrides: dict[str, Any] | None = None,
    root: str | None = None,
    checkpoint: str = "latest",
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """HF + llm.c export of a checkpoint, the HF model registered in MLflow."""
    config = steps_for_checkpoint(resolve_config(preset, overrides or {}, root=root), checkpoint)
    # A fine-tune's name counts its weights' sha256; a named checkpoint needs no name.
    config = with_resolved_init(config, fetching=False, required=checkpoint in (None, "", "latest"))
    result = run_export_stage(config, checkpoint, parent_run_id)
    publish_result(config, result)
    return result


def main() -> None:
    flow_main(export_flow, __doc__, checkpoint="latest")


if __name__ == "__main__":
    main()
