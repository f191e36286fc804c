"""Members grouped by the data they train on: one data stage per distinct data config
(its fingerprint, gpt2.config.identity), however many members share it."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.config.identity import data_fingerprint
from gpt2.root import layout
from gpt2.sweep.members import Member


@dataclass(frozen=True)
class DataGroup:
    fingerprint: str
    manifest: str
    members: tuple[Member, ...]

    @property
    def config(self):
        """The config the group's data stage runs with: its first member's (the data
        section, and so the shards, is the same for all of them)."""
        return self.members[0].config


def data_groups(members: list[Member]) -> list[DataGroup]:
    """In the order their first member appears."""
    by_fp: dict[str, list[Member]] = {}
    for m in members:
        by_fp.setdefault(data_fingerprint(m.config), []).append(m)
    return [DataGroup(fp, layout.manifest(ms[0].config), tuple(ms)) for fp, ms in by_fp.items()]
