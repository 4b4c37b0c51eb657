"""Writing a model folder so that it is never half-written.

A GenAI folder is several files that must agree (``model.onnx`` and its data, ``genai_config.json``,
the tokenizer). Replacing them one by one leaves, after an interrupt or a crash, a new model beside
an old config, which ONNX Runtime GenAI loads and then fails on. So a folder is written whole:

1. the new folder is written as ``folder`` in a hidden staging folder beside the target, in the
   same parent (``.<name>.opreg-staging-<pid>-<random>``), whose ``lock`` file its writer holds an
   exclusive ``flock`` on;
2. files of the old folder that this write does not make (a user's notes, the checkpoint's own
   files when the folder is the checkpoint) are hard-linked into it (copied where a link cannot be
   made), so they are kept; the new folder gets the old one's permissions, and each file that
   replaces one of the old folder (with a model's data file) that file's, so a write never makes
   readable what the old folder kept private;
3. the new folder and the target are swapped in one ``renameat2(RENAME_EXCHANGE)`` (Linux):
   at every instant the target is the complete old folder or the complete new one. Where the
   exchange is not available (or :data:`NO_EXCHANGE_ENV` is set), the old folder is first renamed aside
   (``.<name>.opreg-old-<pid>-<random>``) and the new one renamed in: between the two renames the
   target is missing, and a writer killed there leaves the old folder aside, which the next write
   to that target renames back before anything else;
4. the old folder, now in the staging folder, is removed with it.

A writer killed before the swap leaves its staging folder (nothing at the target changed); the
next write to the same target removes it once its lock is free (a live writer's folder is never
touched). Only entries named by this module's patterns for that target are ever removed, and
never across a mount. A target that is a mount point, or holds one, is refused before the export
(:func:`check_folder`) and again before the swap: a rename cannot move a mount point, and would
carry a mount inside the folder into the staging folder.
SIGTERM ends the write as Ctrl-C does: before the swap the staging folder is removed and the
``KeyboardInterrupt`` goes on; at or after it the write finishes and raises
:class:`opreg.InterruptedAfterSave` (the new folder is in place).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from opreg.errors import InterruptedAfterSave, SaveError
from opreg.exporter import _mounts, _save

logger = logging.getLogger(__name__)

NO_EXCHANGE_ENV = "OPREG_NO_RENAME_EXCHANGE"
"""Set, a folder is swapped in by two renames, never by ``renameat2(RENAME_EXCHANGE)``
(:func:`exchange_allowed`)."""
STAGING_INFIX = ".opreg-staging-"
OLD_INFIX = ".opreg-old-"
_FOLDER_NAME = "folder"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging_prefix(target: Path) -> str:
    """The prefix of the staging folders of writes to ``target``: ``.<name>.opreg-staging-``."""
    return f".{target.name}{STAGING_INFIX}"


def check_folder(path: str | os.PathLike[str]) -> Path:
    """The folder a write to ``path`` replaces or creates (a symlink followed), or a
    :class:`opreg.SaveError` saying why it cannot be written: checked before an export starts."""
    given = _save.as_path(path)
    target = Path(os.path.realpath(given))
    if target.exists() and not target.is_dir():
        raise SaveError(f"cannot write the model folder {given}: it is a file; give a folder (created if missing)")
    if not target.parent.is_dir():
        raise SaveError(f"cannot write the model folder {given}: {target.parent} does not exist; create it first")
    if target == target.parent:
        raise SaveError(f"cannot write the model folder {given}: it is the root of the file system")
    refuse_mounts(given, target)
    try:  # the one sure test of a writable parent: permissions, read-only mounts
        with tempfile.TemporaryFile(dir=target.parent, prefix=staging_prefix(target)):
            pass
    except OSError as e:
        raise SaveError(f"cannot write the model folder {given}: {target.parent} is not writable ({e.strerror})") from e
    return target


def refuse_mounts(given: Path, target: Path) -> None:
    """A :class:`opreg.SaveError` if ``target`` (``given``, in messages) is a mount point or holds one:
    the folder is replaced by renames, which cannot move a mount point, and would carry a mount inside
    it into the staging folder, whose removal would empty the volume."""
    mounts = _mounts.mounts_at_or_under(target)
    if target in mounts:
        raise SaveError(
            f"cannot write the model folder {given}: it is a mount point, and opreg replaces a folder whole by a "
            f"rename, which cannot move a mount; write to a folder inside it (e.g. {given / 'model'})"
        )
    if mounts:
        shown = ", ".join(str(m) for m in mounts[:3]) + (f" and {len(mounts) - 3} more" if len(mounts) > 3 else "")
        what = "is a mount point" if len(mounts) == 1 else "are mount points"
        raise SaveError(
            f"cannot write the model folder {given}: {shown} inside it {what}, and opreg replaces the folder whole, "
            "which would carry the mounted volume along; unmount it or move it out of the folder, or write the "
            "model to another folder"
        )


def write_folder(path: str | os.PathLike[str], fill: Callable[[Path], list[str]]) -> tuple[Path, list[str]]:
    """Write a folder at ``path`` whole: ``fill(folder)`` writes the new files into an empty
    staging folder and returns their names; the old folder's other entries are kept; the new
    folder replaces the old one in one swap. Returns the folder and the names ``fill`` wrote."""
    target = check_folder(path)
    clean_up(target)
    with _save.terminate_as_interrupt(), _staging(target) as staged:
        new = _save.file_id(staged)
        try:
            names = fill(staged)
            if target.is_dir():
                _keep_others(target, staged, set(names))
                _keep_modes(target, staged, names)
            _save.pause("folder-staged")
            refuse_mounts(target, target)  # again: a volume mounted while the model was written
            _swap(staged, target)
            _save.pause("folder-swapped")
        except KeyboardInterrupt as e:
            if _save.file_id(target) == new:  # the swap happened: the new folder is in place
                shutil.rmtree(staged, ignore_errors=True)
                raise InterruptedAfterSave(target) from e
            raise
    return target, names


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A new folder to fill, ``<staging>/folder``, in a staging folder beside ``target`` whose
    ``lock`` file this write holds an exclusive ``flock`` on while it runs. The staging folder
    is removed afterwards (after the swap, ``folder`` there is the old folder)."""
    try:
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{staging_prefix(target)}{os.getpid()}-"))
        lock = os.open(staging / _save.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise SaveError(f"cannot write the model folder {target}: {e.strerror or e}") from e
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)  # held while this write is alive
        (staging / _FOLDER_NAME).mkdir()
        yield staging / _FOLDER_NAME
    finally:
        try:
            remove_tree(staging)
        finally:
            os.close(lock)


def remove_tree(path: Path) -> None:
    """Remove ``path``, a folder opreg made, unless a volume is mounted at or under it (then it is
    left, with a warning): a removal never crosses into a file system opreg did not write."""
    mounts = _mounts.mounts_at_or_under(path)
    if mounts:
        logger.warning("leaving %s: %s is mounted inside it (unmount it, then remove the folder)", path, mounts[0])
        return
    shutil.rmtree(path, ignore_errors=True)


def _keep_others(old: Path, new: Path, written: set[str]) -> None:
    """Hard-link (or copy) into ``new`` every entry of ``old`` the write did not make: not its
    names, not opreg's staging folders, not the data file an old model it replaces owned."""
    replaced = {data for name in written if name.endswith(".onnx") for data in _save.owned_data(old / name)}
    for entry in old.iterdir():
        name = entry.name
        if name in written or name in replaced or name.startswith(_save.STAGING_PREFIX):
            continue
        try:
            if entry.is_symlink():
                os.symlink(os.readlink(entry), new / name)
            elif entry.is_dir():
                shutil.copytree(entry, new / name, symlinks=True, copy_function=_link_or_copy)
            else:
                _link_or_copy(entry, new / name)
        except OSError as e:
            raise SaveError(
                f"cannot keep {entry} in the new model folder: {e.strerror or e}; move it out of {old} or write the "
                "model to another folder"
            ) from e


def _keep_modes(old: Path, new: Path, written: list[str]) -> None:
    """Give ``new`` (the folder replacing ``old``) ``old``'s permissions, and each file written there
    that replaces one of ``old`` that file's, with the data files of a model written so too: a write
    never makes readable what the old folder kept private. A new folder and new files keep the
    permissions the umask gives them."""
    for name in written:
        if (old / name).is_file() and not (old / name).is_symlink():
            data = _save.data_file_pattern(name)
            _save.keep_mode(old / name, [new / made for made in written if made == name or data.match(made)])
    _save.keep_mode(old, [new])


def _link_or_copy(source: str | Path, destination: str | Path) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:  # a file system without hard links, or another device below
        shutil.copy2(source, destination, follow_symlinks=False)


def _swap(staging: Path, target: Path) -> None:
    """Put the folder at ``staging`` at ``target``; the old folder, if any, ends at ``staging``."""
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    if exchange_allowed() and _exchange(staging, target):
        return
    aside = target.parent / f".{target.name}{OLD_INFIX}{os.getpid()}-{secrets.token_hex(4)}"
    logger.debug("replacing %s by two renames (the old folder aside at %s): no atomic exchange", target, aside)
    os.rename(target, aside)
    try:
        _save.pause("folder-aside")
        os.rename(staging, target)
    except BaseException:
        os.rename(aside, target)
        raise
    os.rename(aside, staging)


def exchange_allowed() -> bool:
    """Whether a folder may be swapped in by ``renameat2(RENAME_EXCHANGE)``: unless
    :data:`NO_EXCHANGE_ENV` is set (to anything but ``""``, ``0``, ``false`` or ``no``), for a file
    system that claims the exchange and does it wrong; the two renames are then used, as where the
    exchange is not available."""
    return os.environ.get(NO_EXCHANGE_ENV, "").strip().lower() in ("", "0", "false", "no")


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    system or its file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def clean_up(target: Path) -> None:
    """Remove what interrupted writes to ``target`` left: staging folders whose writer is gone;
    an old folder renamed aside is renamed back if the target is missing, else removed."""
    prefixes = (staging_prefix(target), f".{target.name}{OLD_INFIX}")
    try:
        entries = [e for e in target.parent.iterdir() if e.name.startswith(prefixes)]
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        if entry.name.startswith(prefixes[1]):
            if not os.path.lexists(target):
                logger.info("restoring %s, renamed aside by a write that did not finish", target)
                os.rename(entry, target)
            else:
                remove_tree(entry)
            continue
        with _save.stale_lock(entry) as gone:
            if gone:
                logger.info("removing %s, left by a write that did not finish", entry)
                remove_tree(entry)
