"""Fixtures of the integration tests: the reference engine with its own spans, the caller's."""

from __future__ import annotations

import pytest
from integrations_helpers import running_engine
from telemetry_helpers import Telemetry


@pytest.fixture(scope="module")
def engine_telemetry():
    """The engine's spans (its own service: timers, no attribution)."""
    telemetry = Telemetry.plain()
    yield telemetry
    telemetry.shutdown()


@pytest.fixture(scope="module")
def engine(engine_telemetry):
    """The reference engine on 127.0.0.1 for the module."""
    with running_engine(engine_telemetry) as server:
        yield server


@pytest.fixture
def otel(engine_telemetry):
    """The caller's spans, attributed; the engine's exporter starts empty."""
    engine_telemetry.clear()
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()
