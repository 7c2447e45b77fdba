"""The OpenAI Responses wire format for the scripted upstream of the tests
(:class:`llm_servers.ScriptedServer`): a response object, its stream of events as the
API sends them, and a fake model that runs a tool loop from the input it receives."""

from __future__ import annotations

import itertools
import json
from typing import Any

from llm_servers import Recorded, Reply
from service_harness import sse

__all__ = ["ToolLoopModel", "response_events", "response_json"]

_IDS = itertools.count(1)
USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 40},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 150,
}


def response_json(
    output: list[dict[str, Any]], *, rid: str | None = None, store: bool = True,
    usage: dict[str, Any] | None = None, model: str = "gpt-4o",
) -> dict[str, Any]:  # fmt: skip
    """A completed response object."""
    return {
        "id": rid or f"resp_{next(_IDS)}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": store,
        "usage": usage or USAGE,
    }


def response_events(response: dict[str, Any], pieces: int = 3) -> list[str]:
    """``response`` as the API streams it: created, in_progress, each output item added,
    its text or arguments in ``pieces`` deltas, done; then ``response.completed``."""
    seq = itertools.count()

    def ev(kind: str, **data: Any) -> str:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    start = {**response, "status": "in_progress", "output": [], "usage": None}
    out = [ev("response.created", response=start), ev("response.in_progress", response=start)]
    for index, item in enumerate(response["output"]):
        kind = item["type"]
        if kind == "message":
            out.append(ev("response.output_item.added", output_index=index,
                          item={**item, "status": "in_progress", "content": []}))  # fmt: skip
            for c, part in enumerate(item["content"]):
                ids = {"item_id": item["id"], "output_index": index, "content_index": c}
                out.append(ev("response.content_part.added", **ids,
                              part={**part, "text": ""}))  # fmt: skip
                text = part["text"]
                size = max(1, -(-len(text) // pieces))
                for i in range(0, len(text), size):
                    out.append(ev("response.output_text.delta", **ids, delta=text[i : i + size],
                                  logprobs=[]))  # fmt: skip
                out.append(ev("response.output_text.done", **ids, text=text, logprobs=[]))
                out.append(ev("response.content_part.done", **ids, part=part))
        elif kind == "function_call":
            out.append(ev("response.output_item.added", output_index=index,
                          item={**item, "status": "in_progress", "arguments": ""}))  # fmt: skip
            args = item["arguments"]
            size = max(1, -(-len(args) // pieces))
            for i in range(0, len(args), size):
                out.append(ev("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=index, delta=args[i : i + size]))  # fmt: skip
            out.append(ev("response.function_call_arguments.done", item_id=item["id"],
                          output_index=index, arguments=args))  # fmt: skip
        else:
            out.append(ev("response.output_item.added", output_index=index, item=item))
        out.append(ev("response.output_item.done", output_index=index, item=item))
    out.append(ev("response.completed", response=response))
    return out


class ToolLoopModel:
    """A fake model for the scripted upstream: after a user message it thinks (a
    ``reasoning`` item with ``encrypted_content``), says so, and calls ``lookup`` (with
    an unknown ``x_trace`` item in its output); after the tool's outputs it answers
    ``seen N`` (N: the input items it received). Every request is answered as JSON or as
    a stream, as asked."""

    def __init__(self, store: bool = True) -> None:
        self.store = store
        self.unknown_output = True  # (the SDK's stream accumulator warns on one)
        self.responses: list[dict[str, Any]] = []

    def __call__(self, request: Recorded) -> Reply:
        if not request.path.endswith("/responses"):
            return Reply(404, {"error": {"message": "not here", "type": "test"}})
        body = request.json
        items = body["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        last = items[-1] if items else {}
        n = next(_IDS)
        if last.get("type") == "function_call_output":
            output = [self._message(f"seen {len(items)}", n)]
        else:
            output = [
                {"type": "reasoning", "id": f"rs_{n}", "summary": [],
                 "encrypted_content": f"gAAAAB-opaque-{n}=="},
                self._message(f"Looking up {n}.", n),
                *([{"type": "x_trace", "id": f"xt_{n}", "payload": {"n": n, "note": "opaque"}}]
                  if self.unknown_output else []),
                {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                 "name": "lookup", "arguments": json.dumps({"q": n}), "status": "completed"},
            ]  # fmt: skip
        response = response_json(output, store=self.store, model=body.get("model", "gpt-4o"))
        self.responses.append(response)
        if body.get("stream"):
            return Reply(events=response_events(response))
        return Reply(body=response)

    @staticmethod
    def _message(text: str, n: int) -> dict[str, Any]:
        return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
