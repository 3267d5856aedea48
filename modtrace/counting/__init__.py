"""Request -> units: parse a request, size its media from headers, apply a profile's counters."""

from .counter import (
    CountingConfig,
    CountingError,
    RequestCounter,
    Resolver,
    TextConfig,
    VideoDefaults,
    count_request,
)
from .profile import Profile
from .profiles import DEFAULT_PROFILE, get_profile, list_profiles
from .result import ItemCount, RequestCount

__all__ = [
    "DEFAULT_PROFILE",
    "CountingConfig",
    "CountingError",
    "ItemCount",
    "Profile",
    "RequestCount",
    "RequestCounter",
    "Resolver",
    "TextConfig",
    "VideoDefaults",
    "count_request",
    "get_profile",
    "list_profiles",
]
