"""Shared fixtures: every async test runs on asyncio and on uvloop; no test leaks a thread."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable, Iterator, Mapping

import pytest

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
LOOPS = ["asyncio"] + (["uvloop"] if HAVE_UVLOOP else [])


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run each @pytest.mark.asyncio test once per event loop."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if HAVE_UVLOOP:
        import uvloop

        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture(params=LOOPS)
def loop(request: pytest.FixtureRequest) -> str:
    """The loop name to pass to dataflow.run(loop=...), once per loop."""
    return str(request.param)


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("interop")]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves inter-op threads running after it."""
    yield
    leaked = _pool_threads()
    assert not leaked, f"threads left behind: {leaked}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: longer tests")
