"""The public surface: everything in ``modtrace.__all__`` exists and the list stays sorted."""

import modtrace


def test_all_exported_members_exist():
    """Every name in __all__ resolves on the package."""
    for name in modtrace.__all__:
        assert hasattr(modtrace, name), name


def test_all_is_sorted():
    """__all__ is kept sorted (constants first, as ruff sorts them)."""
    constants = [n for n in modtrace.__all__ if n.isupper()]
    rest = [n for n in modtrace.__all__ if not n.isupper()]
    assert modtrace.__all__ == constants + rest
    assert rest == sorted(rest, key=lambda n: (n.startswith("_") is False and n[0].islower(), n))


def test_public_callables_are_documented():
    """Every public class and function has a docstring."""
    for name in modtrace.__all__:
        obj = getattr(modtrace, name)
        if callable(obj):
            assert obj.__doc__, name
