"""The registry of counting profiles, one module per model family.

Each module in ``modtrace.counting.families`` exports ``PROFILES``; this
module gathers them, once, and resolves names and aliases.
"""

from __future__ import annotations

import importlib
from functools import cache

from .profile import Profile

__all__ = ["DEFAULT_PROFILE", "FAMILY_MODULES", "get_profile", "list_profiles"]

#: The generic estimator of the llm-d router: the default.
DEFAULT_PROFILE = "llm-d"

FAMILY_MODULES: tuple[str, ...] = (
    "llmd",
    "qwen",
    "gemma",
    "llava",
    "internvl",
    "pixtral",
    "phi",
    "qwen_audio",
    "whisper",
    "ultravox",
    "hosted",
)


@cache
def _registry() -> dict[str, Profile]:
    profiles: dict[str, Profile] = {}
    for module in FAMILY_MODULES:
        family = importlib.import_module(f".families.{module}", __package__)
        for profile in family.PROFILES:
            profiles[profile.name] = profile
    return profiles


@cache
def _aliases() -> dict[str, str]:
    table = {}
    for profile in _registry().values():
        for alias in (profile.name, *profile.aliases):
            table[_normalise(alias)] = profile.name
    return table


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def get_profile(name: str) -> Profile:
    """The profile called ``name`` (or one of its aliases).

    Raises:
        ValueError: no such profile; the message lists the known ones.
    """
    found = _aliases().get(_normalise(name))
    if found is None:
        msg = f"unknown profile {name!r}; known: {', '.join(sorted(_registry()))}"
        raise ValueError(msg)
    return _registry()[found]


def list_profiles() -> list[Profile]:
    """Every registered profile, sorted by name."""
    return [_registry()[n] for n in sorted(_registry())]
