"""Fixtures of the calibration tests."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture
def counting_registry(monkeypatch):
    """The real profile registry, limited to the family modules that exist.

    While the family registry is being completed, ``get_profile`` would fail
    on a listed module that is not there yet; once every module exists this
    fixture changes nothing.
    """
    from modtrace.counting import profiles

    present = tuple(
        m
        for m in profiles.FAMILY_MODULES
        if importlib.util.find_spec(f"modtrace.counting.families.{m}") is not None
    )
    if present != profiles.FAMILY_MODULES:
        monkeypatch.setattr(profiles, "FAMILY_MODULES", present)
        profiles._registry.cache_clear()
        profiles._aliases.cache_clear()
        yield profiles
        profiles._registry.cache_clear()
        profiles._aliases.cache_clear()
    else:
        yield profiles
