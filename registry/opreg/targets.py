"""Moved to :mod:`opreg.registry.targets`; this path stays, the same module, for the packs and users that import it."""

import sys

from opreg.registry import targets

sys.modules[__name__] = targets
