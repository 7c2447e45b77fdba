"""HTML pages: the visible text and its links, no markup.

A fetched page is mostly markup, scripts and styles the model does not need; what it
reads is the text a browser shows and where the links go. :func:`html_to_text` keeps
exactly that — block elements become line breaks, ``<a href="u">label</a>`` becomes
``label (u)``, entities are decoded, ``<script>``, ``<style>``, ``<noscript>``,
``<template>``, ``<svg>`` and comments are dropped — in one linear pass (every scan
stops at the next ``<``, and a block with no end tag ends the page), so hostile markup
costs no more than plain text. The text is then cut like an article: its lead first.
"""

from __future__ import annotations

import html
import re

from ctxwarden.cutters.text import Count, fmt, may_fit, truncate_article

__all__ = ["html_to_text", "truncate_html"]

_TAG = re.compile(r"<(/?)([a-zA-Z][\w:-]*)([^<>]*)>|<!--|<![^<>]*>|<\?[^<>]*>")
_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head"})
_BLOCK = frozenset(
    [
        "p",
        "div",
        "br",
        "li",
        "ul",
        "ol",
        "tr",
        "table",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "section",
        "article",
        "header",
        "footer",
        "nav",
        "main",
        "aside",
        "pre",
        "blockquote",
        "dt",
        "dd",
        "dl",
        "form",
        "hr",
        "title",
        "figure",
        "figcaption",
        "details",
        "summary",
    ]
)
_HREF = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>]+))""", re.IGNORECASE)
_TITLE = re.compile(r"<title[^<>]*>([^<]*)")
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANKS = re.compile(r"\n\s*\n\s*")


def html_to_text(page: str) -> str:
    """The visible text of ``page`` with links as ``label (url)``, one pass."""
    lower = page.lower()
    out: list[str] = []
    href: str | None = None
    link_start = 0
    pos = 0
    while True:
        match = _TAG.search(page, pos)
        if match is None:
            out.append(html.unescape(page[pos:]))
            break
        out.append(html.unescape(page[pos : match.start()]))
        pos = match.end()
        token = match.group(0)
        if token == "<!--":
            end = page.find("-->", pos)
            pos = len(page) if end < 0 else end + 3
            continue
        closing, name = match.group(1), (match.group(2) or "").lower()
        if not name:
            continue
        if name in _SKIP and not closing:
            end = lower.find(f"</{name}", pos)
            if name == "head":  # keep the title, skip the rest of the head
                if end < 0:
                    continue  # an open head (its end tag is optional): read on
                title = _TITLE.search(lower, pos, end)
                if title:
                    out.append(html.unescape(page[title.start(1) : title.end(1)]) + "\n")
            pos = len(page) if end < 0 else end
            continue
        if name == "a":
            if closing and href is not None:
                label = "".join(out[link_start:]).strip()
                if href and href not in label and not href.startswith(("#", "javascript:")):
                    out.append(f" ({href})")
                href = None
            elif not closing:
                found = _HREF.search(match.group(3) or "")
                href = (
                    html.unescape(next(g for g in found.groups() if g is not None)) if found else ""
                )
                link_start = len(out)
            continue
        if name in _BLOCK or name in ("td", "th"):
            out.append("\n" if name not in ("td", "th") else " ")
    text = _SPACES.sub(" ", "".join(out))
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANKS.sub("\n\n", text).strip()


def truncate_html(text: str, *, target_tokens: int, count: Count, total: int | None = None) -> str:
    """The page as text and links within the target; its lead when even that is too long.
    The marker counts against the page's tokens, markup included."""
    total = count(text) if total is None else total
    visible = html_to_text(text)
    budget = max(target_tokens - 16, 1)
    if may_fit(visible, budget) and count(visible) <= budget:
        cut = max(total - count(visible), 0)
        return f"{visible}\n\n[... markup cut: {fmt(cut)} of {fmt(total)} tokens ...]"
    return truncate_article(visible, target_tokens=target_tokens, count=count, total=total)
