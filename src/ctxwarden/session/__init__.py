"""Sessions (R13): a conversation, its summary, facts and build state in a store."""

from ctxwarden.session.session import Session, SummaryWrite, count_key

__all__ = ["Session", "SummaryWrite", "count_key"]
