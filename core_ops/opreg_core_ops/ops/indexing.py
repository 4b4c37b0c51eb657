"""Core impls: indexing (being written)."""

from __future__ import annotations

import opreg


def register(registry: opreg.Registrar) -> None:
    pass
