"""A local ``/v1/embeddings`` server for tests, with a deterministic toy embedding model.

:func:`toy_vector` is a bag of concepts: each word of a small synonym class ("cancelled",
"scrapped", "axed") adds to that class's dimension, and every other word adds a little to
one of :data:`HASHED` dimensions chosen by its CRC32. So two paraphrases ("was my flight
cancelled?" and "the airline scrapped our departure") land near each other although they
share no word, and texts on other topics land far away. It is a model, not a mock: the
real ``openai`` SDK talks to :class:`EmbeddingServer` over HTTP in the wire format
(``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}]}``),
and :attr:`EmbeddingServer.inputs` records every text it was asked to embed.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from typing import Any

from llm_servers import Recorded, Reply, ScriptedServer

__all__ = ["CONCEPTS", "HASHED", "EmbeddingServer", "toy_vector"]

CONCEPTS: tuple[frozenset[str], ...] = tuple(
    frozenset(words.split())
    for words in (
        "flight flights plane airline airlines departure departures aircraft jet",
        "cancelled canceled cancel cancellation scrapped scrap axed grounded",
        "refund reimbursement money repaid compensation",
        "sister brother sibling siblings",
        "allergic allergy peanuts nuts intolerance",
        "hotel lodging accommodation inn",
    )
)
HASHED = 32
_WORD = re.compile(r"[a-z]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "was",
        "is",
        "are",
        "my",
        "our",
        "we",
        "i",
        "to",
        "of",
        "in",
        "on",
        "and",
        "or",
        "it",
        "that",
        "this",
    ]
)


def toy_vector(text: str) -> list[float]:
    """The toy model's vector of ``text`` (see the module docstring)."""
    vector = [0.0] * (len(CONCEPTS) + HASHED)
    for word in _WORD.findall(text.lower()):
        if word in _STOP:
            continue
        for i, words in enumerate(CONCEPTS):
            if word in words:
                vector[i] += 1.0
                break
        else:
            vector[len(CONCEPTS) + zlib.crc32(word.encode()) % HASHED] += 0.15
    return vector


class EmbeddingServer(ScriptedServer):
    """A :class:`ScriptedServer` answering ``POST /v1/embeddings`` with :func:`toy_vector`."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.inputs: Counter[str] = Counter()

    def _answer(self, request: Recorded) -> Reply:
        if not request.path.endswith("/embeddings"):
            return Reply(404, {"error": {"message": f"no route {request.path}", "type": "test"}})
        body: dict[str, Any] = request.json
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if any(not isinstance(t, str) or not t for t in texts):
            return Reply(400, {"error": {"message": "input must be non-empty strings"}})
        self.inputs.update(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": toy_vector(t)}
            for i, t in enumerate(texts)
        ]
        usage = {"prompt_tokens": sum(len(t.split()) for t in texts), "total_tokens": 0}
        return Reply(body={"object": "list", "data": data, "model": body["model"],
                           "usage": usage})  # fmt: skip

    def embed_requests(self) -> list[dict[str, Any]]:
        return [json.loads(r.body) for r in self.requests if r.path.endswith("/embeddings")]
