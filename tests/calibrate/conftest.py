"""Fixtures of the calibration tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def cli():
    """The ``modtrace`` command's ``main``, run in-process."""
    from modtrace.cli.main import main

    return main
