"""The base of every section of the config tree (gpt2.config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Frozen so a config can be hashed and passed between stages safely;
    # extra="forbid" so a typo in an override is an error, not a silent no-op.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
