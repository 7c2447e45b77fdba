"""The calibration bench's ratio: pooled over texts, computed with offline encodings only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ctxwarden.bench.calibrate import CJK, CODE, CYRILLIC, corpus, ratio
from ctxwarden.encodings import get_encoding


def _counter(name: str) -> Callable[[str], int]:
    enc = get_encoding(name)
    return lambda text: len(enc.encode(text, disallowed_special=()))


def test_ratio_is_pooled_total_over_total() -> None:
    o200k, cl100k = _counter("o200k_base"), _counter("cl100k_base")
    texts = ["Привіт, світе! Як справи?", "hello world"]
    expected = sum(map(cl100k, texts)) / sum(map(o200k, texts))
    assert ratio(cl100k, o200k, texts) == pytest.approx(expected)
    # cl100k has far fewer Cyrillic merges than o200k: the older vocabulary costs more
    assert ratio(cl100k, o200k, texts[:1]) > 1.3
    assert ratio(o200k, o200k, texts) == 1.0


def test_ratio_rejects_texts_without_tokens() -> None:
    o200k = _counter("o200k_base")
    with pytest.raises(ValueError, match="at least one base token"):
        ratio(o200k, o200k, ["", ""])


def test_corpus_always_has_the_builtin_kinds(tmp_path: Path) -> None:
    kinds, notes = corpus(tmp_path)  # an empty folder: no tau-bench, no LoCoMo
    assert kinds == {"code": CODE, "cyrillic": CYRILLIC, "cjk": CJK}
    assert len(notes) == 2
