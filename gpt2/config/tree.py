"""The one typed config tree of the pipeline, and the checks that read more
than one of its fields.

Every stage gets only its slice. Fields that change a result are *identity*
(they enter cache keys and fingerprints); the `runtime` slice only says where
or how fast things run and never enters an identity.

    gpt2 config show --preset smoke --set train.max_steps=20

The checks that read more than one field, or more than the value (Config runs
them after every field passed its own range):

- no URL field embeds credentials (they would be logged with the config);
- the artifact root's scheme is one the project supports, refused before any
  lookup (fsspec would accept, say, ftp://host/... and fail seconds later in a
  DNS lookup that never names the root);
- a step is whole sequences (train.total_batch_tokens a multiple of
  model.block_size), known here rather than inside the trainer after a server
  start (the device count, which must divide it too, is only known there).

Each problem is a pydantic error on its own field, its value shown redacted: a
ValueError would become an error whose text shows the whole config, secret
included.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from gpt2.config.data import DataConfig
from gpt2.config.runtime import RuntimeConfig
from gpt2.config.sections import EvalConfig, ExportConfig, ModelConfig, Section, TrackingConfig
from gpt2.config.train import TrainConfig
from gpt2.secrets import URL_FIELDS, redact, url_has_credentials

ROOT_SCHEMES = ("file", "gs", "gcs", "s3", "s3a", "az", "abfs", "abfss", "memory")
"""Artifact-root schemes the project supports (local disk, GCS, S3, Azure, fsspec's in-memory store)."""
BUCKET_SCHEMES = ("gs", "gcs", "s3", "s3a", "az", "abfs", "abfss")
"""Schemes whose URL starts with a bucket (or container): `s3://` alone names none, and fsspec would
take it for a local folder named `s3:` (a run would train into it, its MLflow store elsewhere)."""

CREDENTIALS = PydanticCustomError(
    "credentials_in_url",
    "must not embed credentials (they would be logged with the config); pass them through the "
    "environment instead (MLFLOW_TRACKING_USERNAME/PASSWORD, GOOGLE_APPLICATION_CREDENTIALS, "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, HF_TOKEN)",
)


def root_schemes() -> set[str]:
    """ROOT_SCHEMES, and any filesystem a program registered itself with
    fsspec.register_implementation (not one of fsspec's stock protocols)."""
    from fsspec.registry import known_implementations, registry

    return set(ROOT_SCHEMES) | {p for p in registry if p not in known_implementations}


def _root_error(root: str) -> PydanticCustomError | None:
    """What is wrong with the artifact root's URL, if anything: a scheme the project does not
    support, or a supported one that names no place (no bucket after a bucket scheme, no path after
    `file://`; `memory://` needs none: its own store's top)."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)", root)
    if not match:
        return None  # a plain path
    scheme, rest = match.group(1).lower(), match.group(2).strip()
    if scheme not in root_schemes():
        return PydanticCustomError(
            "root_scheme", "the scheme '{scheme}' is not supported for an artifact root; use a local path or a "
            "{schemes} URL", {"scheme": match.group(1), "schemes": ", ".join(s + "://" for s in ROOT_SCHEMES)})
    bucket = scheme in BUCKET_SCHEMES
    if (rest.split("/", 1)[0] if bucket else rest) or scheme == "memory":
        return None
    example = f"{scheme}://BUCKET/PREFIX" if bucket else f"{scheme}:///abs/path or a plain path"
    return PydanticCustomError("root_place", "names no {what} after '{scheme}://': give one, e.g. {example}",
                               {"what": "bucket" if bucket else "path", "scheme": scheme, "example": example})


def cross_field_errors(config: Any) -> list[InitErrorDetails]:
    """The problems of a whole config (its sections as attributes), each a pydantic
    error on its own field. Called by the config's own validator, so this module
    reads the sections by name and never imports the config's class."""
    values = {f: getattr(getattr(config, f.split(".")[0]), f.split(".")[1]) for f in URL_FIELDS}
    errors = [InitErrorDetails(type=CREDENTIALS, loc=tuple(f.split(".")), input=redact(v))
              for f, v in values.items() if url_has_credentials(v)]
    root_error = _root_error(config.runtime.root)
    if root_error is not None:
        errors.append(InitErrorDetails(type=root_error, loc=("runtime", "root"), input=redact(config.runtime.root)))
    tokens, T = config.train.total_batch_tokens, config.model.block_size
    if tokens % T:
        error = PydanticCustomError(
            "whole_sequences", "must be a multiple of model.block_size ({T}): whole sequences per step; "
            "e.g. {lower} or {upper}", {"T": T, "lower": max(T, tokens // T * T), "upper": (tokens // T + 1) * T})
        errors.append(InitErrorDetails(type=error, loc=("train", "total_batch_tokens"), input=tokens))
    return errors


class Config(Section):
    preset: str = "gpt2-124m"
    """Preset the config was built from (informational)."""
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportConfig = ExportConfig()
    tracking: TrackingConfig = TrackingConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    @model_validator(mode="after")
    def _checked_across_sections(self) -> "Config":
        # Every check that reads more than one field (cross_field_errors, above),
        # reported together, each value shown redacted.
        errors = cross_field_errors(self)
        if errors:
            raise ValidationError.from_exception_data("Config", errors)
        return self
