"""Embedding recall: a vector ranking of left-out messages, fused with BM25's.

BM25 (:mod:`ctxwarden.steps.recall_relevant`) finds the passages that share words with the
request; it misses a paraphrase ("my flight got scrapped" for "the airline cancelled the
booking"). With ``[recall] embeddings = "<spec>"`` each stored message has a vector
(computed outside the build, :mod:`ctxwarden.llm.embeddings`), and the recall step ranks
its sources a second way: by the cosine similarity of each message's vector with the
query's (the vector of the newest user message, which is the query). The two rankings
are merged by **reciprocal rank fusion** (Cormack, Clarke and Büttcher, 2009): a
passage scores ``1/(k + rank)`` in each ranking it appears in, summed, ``k = 60``. RRF
needs no calibration between BM25 scores and cosines (they are on unrelated scales), a
passage both rankings place high wins, and one ranking alone still contributes.

Vectors belong to messages, BM25 scores to passages (a message cut in pieces of about
``passage_tokens``). A message's vector rank goes to its first passage, its second
passage comes after every ranked message's first, and so on: one long similar message
does not push the next similar message out of the recall block. Only messages with a
positive cosine, at most :data:`DEPTH` of them, are ranked (the fused list is a ranking
of what is relevant, not of everything).

The step stays pure: :class:`RecallVectors` is an explicit input of the build (the
session reads the stored vectors of the messages it read, and the query's). A build
without it ranks by BM25 alone, exactly as before.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ctxwarden.core.messages import Message

__all__ = ["DEPTH", "RRF_K", "RecallVectors", "embedding_text", "fuse", "vector_ranking"]

RRF_K = 60
"""The RRF constant of the original paper (ranks past the first few differ little)."""
DEPTH = 50
"""Messages the vector ranking holds at most (a block shows a handful of passages)."""
EMBED_CHARS = 8000
"""Characters of a message that are embedded (about 2,000 tokens: well within the
8,191-token input of OpenAI's embedding models, and of the usual local ones)."""


@dataclass(frozen=True)
class RecallVectors:
    """The vectors a build may use: ``model`` (``provider:model`` of the embeddings spec
    that made them, :func:`~ctxwarden.llm.embeddings.embeddings_key`) and
    one vector per message id (a message without one is ranked by BM25 alone). The query
    is the newest user message's own vector, so it is here too."""

    model: str
    by_id: Mapping[str, Sequence[float]]

    def digest(self, query: Sequence[float], ids: Sequence[str]) -> str:
        """A short digest of the query vector and of which of ``ids`` have a vector (the
        recall memo's key: a stored message's vector never changes, so which messages
        have one, and the query's, say what the ranking depends on)."""
        h = hashlib.sha1(self.model.encode(), usedforsecurity=False)
        h.update(struct.pack(f"<{len(query)}d", *query))
        h.update(bytes(1 if self.by_id.get(i) else 0 for i in ids))
        return h.hexdigest()


def embedding_text(message: Message) -> str:
    """What is embedded of a message: its text and, for a tool call, its calls (what
    the recall step scores), the first :data:`EMBED_CHARS` characters; ``""``: nothing."""
    calls = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls)
    text = f"{message.text}\n{calls}" if calls else message.text
    return text[:EMBED_CHARS].strip()


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b) or not a:
        return 0.0
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(x * x for x in b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def vector_ranking(
    query: Sequence[float], sources: Sequence[tuple[int, Message]], vectors: RecallVectors
) -> list[int]:
    """Positions of the sources with a positive cosine to ``query``, most similar first
    (ties: older first), at most :data:`DEPTH`."""
    scored = []
    for pos, m in sources:
        v = vectors.by_id.get(m.id)
        if v:
            score = _cosine(query, v)
            if score > 0.0:
                scored.append((-round(score, 9), pos))
    scored.sort()
    return [pos for _, pos in scored[:DEPTH]]


class _Piece(Protocol):
    @property
    def pos(self) -> int: ...

    @property
    def part(self) -> int: ...


P = TypeVar("P", bound=_Piece)


def fuse(bm25: Sequence[P], passages: Sequence[P], by_vector: Sequence[int]) -> list[P]:
    """``bm25`` (passages, best first) and ``by_vector`` (message positions, best first)
    merged by reciprocal rank fusion over ``passages`` (see the module docstring); ties
    keep the older passage first, so the order is the same at every build."""
    score: dict[tuple[int, int], float] = {}
    for rank, p in enumerate(bm25, 1):
        score[(p.pos, p.part)] = 1.0 / (RRF_K + rank)
    msg_rank = {pos: r for r, pos in enumerate(by_vector)}
    parts: dict[int, list[P]] = {}
    for p in passages:
        if p.pos in msg_rank:
            parts.setdefault(p.pos, []).append(p)
    # a message's n-th passage comes after every ranked message's (n-1)-th
    order = sorted(
        ((n, msg_rank[pos], p) for pos, ps in parts.items()
         for n, p in enumerate(sorted(ps, key=lambda q: q.part))),
        key=lambda t: (t[0], t[1]),
    )  # fmt: skip
    for rank, (_, _, p) in enumerate(order, 1):
        key = (p.pos, p.part)
        score[key] = score.get(key, 0.0) + 1.0 / (RRF_K + rank)
    found = {(p.pos, p.part): p for p in passages}
    best = sorted(score, key=lambda k: (-round(score[k], 12), k))
    return [found[k] for k in best if k in found]
