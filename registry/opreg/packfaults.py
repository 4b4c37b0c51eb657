"""Moved to :mod:`opreg.packs.packfaults`; this path stays, the same module, for the packs and users that import it."""

import sys

from opreg.packs import packfaults

sys.modules[__name__] = packfaults
