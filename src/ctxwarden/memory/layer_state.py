"""The summary and facts a build shows, as of a summary cycle: the layers' part of the
state a later turn needs (stored with the build state, made outside the build)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.memory.facts import Facts
from ctxwarden.memory.summaries import SummaryState

__all__ = ["LayerState"]


@dataclass(frozen=True)
class LayerState:
    """Summary and facts as of a cycle; ``cut`` is where the summary's coverage ends
    (a position in the history), ``seen`` how many messages the free fact extractor
    has read."""

    summary: SummaryState = field(default_factory=SummaryState)
    facts: Facts = field(default_factory=Facts)
    cut: int = 0
    seen: int = 0

    def to_dict(self) -> dict[str, Any]:
        s = self.summary
        return {
            "summary": {
                "summaries": list(s.summaries),
                "meta_summary": s.meta_summary,
                "covered_ids": sorted(s.covered_ids),
                "covered_count": s.covered_count,
                "as_of_id": s.as_of_id,
                "version": s.version,
                "cycles": s.cycles,
                "view": s.view,
            },
            "facts": self.facts.to_json(),
            "cut": self.cut,
            "seen": self.seen,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerState:
        s = data["summary"]
        summary = SummaryState(
            summaries=tuple(str(t) for t in s["summaries"]),
            meta_summary=s.get("meta_summary"),
            covered_ids=frozenset(str(i) for i in s.get("covered_ids", ())),
            covered_count=int(s.get("covered_count", 0)),
            as_of_id=s.get("as_of_id"),
            version=int(s.get("version", 0)),
            cycles=int(s.get("cycles", 0)),
            view=s.get("view"),
        )
        facts = Facts.from_json(data["facts"])
        return cls(summary, facts, int(data.get("cut", 0)), int(data.get("seen", 0)))
