"""``python -m modtrace``."""

import sys

from .cli import main

sys.exit(main())
