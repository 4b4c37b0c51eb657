"""Mount points at or under a path a save replaces: a save never carries, moves or empties a volume.

A save replaces its target by renames in the target's folder. A rename cannot move a mount point
(``EBUSY``), and one that moves a folder holding a mount point carries the live mount along, where a
later removal of that folder would delete the volume's files. So a save refuses, before it starts,
a target that is a mount point or holds one.

The mounts are read from ``/proc/self/mountinfo`` (Linux: bind mounts of the same file system
too); elsewhere a path on another device than its parent is taken as a mount point.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")
"""``mountinfo`` writes a space, tab, newline or backslash in a path as ``\\ooo`` (octal)."""


def mount_points() -> list[Path] | None:
    """Every mount point of this process's view of the file systems, ``None`` where the system
    does not list them (no ``/proc/self/mountinfo``)."""
    try:
        with open(MOUNTINFO, "rb") as f:
            lines = f.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # id, parent, major:minor, root, mount point, ...
            found.append(Path(_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])))
    return found


def mounts_at_or_under(path: Path) -> list[Path]:
    """The mount points that are ``path`` (its real path: symbolic links followed) or lie under it,
    sorted; ``[]`` for a path that does not exist."""
    real = Path(os.path.realpath(path))
    if not os.path.lexists(real):
        return []
    listed = mount_points()
    if listed is not None:
        return sorted({m for m in listed if m == real or real in m.parents})
    return _other_devices(real)


def _other_devices(real: Path) -> list[Path]:
    """Without a list of mounts: ``real`` if it is on another device than its parent, and the
    folders under it on another device than ``real``."""
    try:
        device = os.lstat(real).st_dev
        found = [real] if real != real.parent and os.lstat(real.parent).st_dev != device else []
    except OSError:
        return []
    for top, folders, _ in os.walk(real):
        for name in list(folders):
            entry = Path(top) / name
            try:
                if os.lstat(entry).st_dev != device:
                    found.append(entry)
                    folders.remove(name)  # not walked into
            except OSError:
                continue
    return sorted(found)
