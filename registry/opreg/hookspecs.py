"""Moved to :mod:`opreg.packs.hookspecs`; this path stays, the same module, for the packs and users that import it."""

import sys

from opreg.packs import hookspecs

sys.modules[__name__] = hookspecs
