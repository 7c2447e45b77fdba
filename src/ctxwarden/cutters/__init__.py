"""The text cutters of the truncation step: one per kind of tool result, and the registry.

Each module cuts one kind of text to a token target, keeping what an agent needs from it
(:mod:`~ctxwarden.cutters.stack_trace`, :mod:`~ctxwarden.cutters.json_doc`,
:mod:`~ctxwarden.cutters.code`, :mod:`~ctxwarden.cutters.log`,
:mod:`~ctxwarden.cutters.diff`, :mod:`~ctxwarden.cutters.html_page`,
:mod:`~ctxwarden.cutters.text`); :mod:`~ctxwarden.cutters.lines` holds the line selection
they share, :mod:`~ctxwarden.cutters.terms` what a request looked for, and
:mod:`~ctxwarden.cutters.values` lists the values a cut removed. The ``kind -> cutter``
registry (:data:`CUTTERS`, :func:`with_cutters`) and :func:`truncate_by_kind` are in
:mod:`~ctxwarden.cutters.by_kind`. The package is pure text work: it imports no step.
"""

from ctxwarden.cutters.by_kind import (
    CUTTERS,
    Cut,
    CutRequest,
    Cutter,
    Detect,
    truncate_by_kind,
    with_cutters,
)

__all__ = ["CUTTERS", "Cut", "CutRequest", "Cutter", "Detect", "truncate_by_kind", "with_cutters"]
