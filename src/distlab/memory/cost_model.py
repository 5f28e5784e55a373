"""The old home of `distlab.memory.estimate.cost_model` (issue 36, item 5, moved it):
the labs and the book import it by this name, which is the same module."""

import sys

from distlab.memory.estimate import cost_model

sys.modules[__name__] = cost_model
