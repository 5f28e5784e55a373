"""The old home of `distlab.memory.techniques.compression` (issue 36, item 5, moved it):
the labs and the book import it by this name, which is the same module."""

import sys

from distlab.memory.techniques import compression

sys.modules[__name__] = compression
