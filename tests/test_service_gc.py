"""``serve`` tunes the collector of its own process (and only there)."""

from __future__ import annotations

import gc

from ctxwarden.service import _tune_gc


def test_serve_collects_the_young_less_often_and_freezes_startup() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        _tune_gc()
        assert gc.get_threshold() == (50_000, 10, 10)
        assert gc.get_freeze_count() > 0  # startup's objects left out of full collections
        gc.set_threshold(80_000, 10, 10)
        _tune_gc()
        assert gc.get_threshold()[0] == 80_000  # a higher setting is kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_building_the_app_leaves_the_collector_alone() -> None:
    from ctxwarden.service import ServiceConfig, create_app

    before = gc.get_threshold()
    create_app(ServiceConfig(db="sqlite:///:memory:", upstream="http://127.0.0.1:9/v1"))
    assert gc.get_threshold() == before
