"""Moved to :mod:`opreg.packs.plugins`; this path stays, the same module, for the packs and users that import it."""

import sys

from opreg.packs import plugins

sys.modules[__name__] = plugins
