"""Shared by every test folder: the helper modules at the top of ``tests/`` import by name.

Test folders have no ``__init__.py``; a helper module next to the tests of
one folder (``report_helpers.py``) imports by its name from there, and the
ones here (``telemetry_helpers.py``, ``chat_helpers.py``, ``otlp_receiver.py``)
from every folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
