"""A small step of the kind users write: drop the window's messages that carry a tag.

    Policy(steps=[DropTagged("debug")])          # or in TOML:
    [[steps]]
    use = "ctxwarden.steps.drop_tagged:DropTagged"
    tag = "debug"

A message is tagged by ``meta={"tags": ["debug"]}`` (``ctxwarden.meta.tags`` on the wire).
The step only filters the window; the engine's pair check afterwards takes out a tool call
whose result it dropped (or the reverse), so the step cannot leave an orphan behind. It
never drops the newest user message.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxwarden.steps.base import Action, Draft, StepContext, StepResult

__all__ = ["DropTagged"]


@dataclass(frozen=True)
class DropTagged:
    """Drop every window message whose ``meta["tags"]`` holds ``tag``."""

    tag: str
    name: str = "drop_tagged"

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        newest = draft.history[draft.newest].id if draft.newest is not None else None
        kept, actions = [], []
        for m in draft.window:
            tags = m.meta.get("tags", ())
            if m.id != newest and isinstance(tags, list | tuple) and self.tag in tags:
                reason = f"tagged {self.tag!r}"
                actions.append(Action(m.id, "dropped", reason, ctx.count(m), 0, self.name))
            else:
                kept.append(m)
        return StepResult(draft.but(window=tuple(kept)), tuple(actions))
