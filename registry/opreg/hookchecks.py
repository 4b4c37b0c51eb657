"""Moved to :mod:`opreg.packs.hookchecks`; this path stays, the same module, for the packs and users that import it."""

import sys

from opreg.packs import hookchecks

sys.modules[__name__] = hookchecks
