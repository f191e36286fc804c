"""Export one checkpoint: the HF directory and the llm.c files, under the run.

    {root}/runs/{run}/export/step_000060/hf/            GPT2LMHeadModel + tokenizer + README.md (model card)
    {root}/runs/{run}/export/step_000060/llmc/gpt2_124M.bin, gpt2_tokenizer.bin
    {root}/runs/{run}/export/step_000060/manifest.json  written last: files, sizes, sha256

Files are built in a local scratch directory, then uploaded one by one
(atomic per file); the manifest marks the export complete. On any failure the
partial export directory is removed, so nothing half-written is left.

The model card reports the evaluate stage's HellaSwag result for the same
checkpoint; an evaluation written after the export makes the export stale, so
it is written again (the manifest records which result its card holds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gpt2.checkpoint.catalog import read_marker
from gpt2.checkpoint.ref import CheckpointRef
from gpt2.checkpoint.store import load_model, read_verified
from gpt2.config.identity import EXPORT_FORMAT_VERSION, fingerprint
from gpt2.errors import UserError
from gpt2.export import card, hf, llmc
from gpt2.eval.hellaswag.evaluate import result_url
from gpt2.root import storage
from gpt2.root.checks import check_writable

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class ExportError(UserError, RuntimeError):
    """The export could not be written; the message names the destination."""


@dataclass(frozen=True)
class ExportResult:
    export_dir: str
    hf_dir: str
    llmc_bin: str
    llmc_tokenizer: str
    step: int
    checkpoint: str
    model_sha256: str
    card_eval: str | None = None
    """Which evaluation of the checkpoint the model card reports (None: none yet)."""

    def to_dict(self) -> dict:
        return asdict(self)


def export_dir_url(ref: CheckpointRef, root: str) -> str:
    return ref.output_dir(root, "export")


def card_facts(ref: CheckpointRef, root: str) -> card.CardFacts:
    """What the model card says of `ref`: its state.json (verified) and the
    evaluate stage's result for it, when there is one."""
    marker = read_marker(ref.url) or {}
    state = json.loads(read_verified(ref.url, "state.json", marker.get("files", {}).get("state.json", {})))
    from gpt2.config.tree import Config

    return card.CardFacts(config=Config.model_validate(state["config"]), step=ref.step, state=state,
                          hellaswag=read_eval_result(ref, root), code_version=card.code_version())


def read_eval_result(ref: CheckpointRef, root: str) -> dict | None:
    """The HellaSwag result of these exact weights, or None."""
    try:
        result = storage.read_record(result_url(ref, root))
    except (OSError, ValueError):
        return None
    return result if result and result.get("model_sha256") == ref.model_sha256 else None


def build_local(ref: CheckpointRef, out: Path, facts: card.CardFacts) -> dict[str, Path]:
    """Write every export file under a local directory; returns relative name → path."""
    model, config = load_model(ref.url, "cpu")
    state = model.state_dict()
    hf.write_hf_dir(state, config.model, out / "hf")
    (out / "hf" / "README.md").write_text(card.model_card(facts), encoding="utf-8")
    (out / "llmc").mkdir()
    llmc.write_model_bin(state, config.model, out / "llmc" / llmc.model_file_name(config.model))
    llmc.write_tokenizer_bin(out / "llmc" / "gpt2_tokenizer.bin")
    return {p.relative_to(out).as_posix(): p for p in sorted(out.rglob("*")) if p.is_file()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _upload(files: dict[str, Path], dest: str, ref: CheckpointRef, facts: card.CardFacts) -> dict:
    manifest = {"format": EXPORT_FORMAT_VERSION, "checkpoint": ref.url, "step": ref.step,
                "model_sha256": ref.model_sha256, "card_eval": facts.eval_id(), "files": {}}
    for name, path in files.items():
        storage.put_file_atomic(path, storage.join(dest, name))
        manifest["files"][name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    storage.write_record(storage.join(dest, MANIFEST), manifest)  # last: marks the export complete
    return manifest


def read_manifest(dest: str) -> dict | None:
    try:
        return storage.read_record(storage.join(dest, MANIFEST))
    except OSError:  # a root we cannot even read
        return None


def export_complete(dest: str, ref: CheckpointRef, root: str | None = None) -> bool:
    """An export of these exact weights is already there, every file whole;
    given the `root`, its model card also holds the checkpoint's current
    evaluation (without it, as a read-only root answers: whatever it holds)."""
    manifest = read_manifest(dest)
    return bool(
        manifest
        and manifest.get("model_sha256") == ref.model_sha256
        and manifest.get("format") == EXPORT_FORMAT_VERSION
        and (root is None or manifest.get("card_eval") == _eval_id(ref, root))
        and all(storage.size(storage.join(dest, n)) == f["bytes"] for n, f in manifest["files"].items())
    )


def verify_hf_copy(dest: str, local: Path) -> None:
    """Check a local copy of the export's HF directory against its manifest
    (size and sha256 of every file); raise ExportError naming a damaged one."""
    manifest = read_manifest(dest) or {"files": {}}
    for name, expected in manifest["files"].items():
        if not name.startswith("hf/"):
            continue
        path = local / name.removeprefix("hf/")
        if not path.is_file() or path.stat().st_size != expected["bytes"] or _sha256(path) != expected["sha256"]:
            raise ExportError(f"export file {storage.join(dest, name)} does not match its {MANIFEST} (damaged or "
                              f"missing); remove {dest} and run the export again")


def _eval_id(ref: CheckpointRef, root: str) -> str | None:
    result = read_eval_result(ref, root)
    return None if result is None else fingerprint(result["hellaswag"])


def _result(dest: str, ref: CheckpointRef, manifest: dict) -> ExportResult:
    llmc_bin = next(n for n in manifest["files"] if n.startswith("llmc/gpt2_") and n != "llmc/gpt2_tokenizer.bin")
    return ExportResult(
        export_dir=dest,
        hf_dir=storage.join(dest, "hf"),
        llmc_bin=storage.join(dest, llmc_bin),
        llmc_tokenizer=storage.join(dest, "llmc/gpt2_tokenizer.bin"),
        step=ref.step,
        checkpoint=ref.url,
        model_sha256=ref.model_sha256,
        card_eval=manifest.get("card_eval"),
    )


def export_checkpoint(ref: CheckpointRef, root: str, work_dir: str | Path | None = None) -> ExportResult:
    """Export the checkpoint `ref` into its run's directory under the artifact
    root (reused when an export of the same weights is already complete)."""
    dest = export_dir_url(ref, root)
    if export_complete(dest, ref, root):
        log.info("export of %s already complete at %s", ref.url, dest)
        return _result(dest, ref, read_manifest(dest))
    check_writable(storage.normalize_url(root))
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="gpt2-export-") as tmp:
        facts = card_facts(ref, root)
        files = build_local(ref, Path(tmp), facts)
        storage.remove(dest, recursive=True)  # leftovers of an interrupted export
        try:
            manifest = _upload(files, dest, ref, facts)
        except Exception as err:
            storage.remove(dest, recursive=True)
            raise ExportError(f"writing the export to {dest} failed ({type(err).__name__}: {err}); nothing was kept") from err
    log.info("exported %s to %s", ref.url, dest)
    return _result(dest, ref, manifest)
