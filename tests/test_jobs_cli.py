"""Bad options of ``ctxwarden worker`` and ``serve --broker`` are one clear error each,
before anything starts (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_harness import cli


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--broker", "amqp://127.0.0.1", "--summarizer", "offline"], "must be a Redis URL"),
        (["--broker", "redis://127.0.0.1:6379/0", "--summarizer", "nope:x"], "bad model spec"),
    ],
)
def test_worker_refuses_bad_options(tmp_path: Path, args: list[str], says: str) -> None:
    done = cli("worker", "--db", f"sqlite:///{tmp_path / 'w.db'}", *args)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_worker_names_an_unreachable_store(tmp_path: Path) -> None:
    done = cli(
        "worker", "--db", "postgresql://postgres@127.0.0.1:1/x",
        "--broker", "redis://127.0.0.1:6379/0", "--summarizer", "offline",
    )  # fmt: skip
    assert done.returncode != 0
    assert "cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/x" in done.stderr


def test_serve_refuses_a_broker_that_is_not_redis(tmp_path: Path) -> None:
    done = cli(
        "serve", "--db", f"sqlite:///{tmp_path / 's.db'}",
        "--upstream", "http://127.0.0.1:9/v1", "--broker", "amqp://127.0.0.1",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--broker must be a Redis URL" in done.stderr
