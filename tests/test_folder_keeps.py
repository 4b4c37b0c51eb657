"""Output folders keep what they held (issue 53): a folder written whole (``opreg llm export -o DIR``)
gets the old folder's permissions, and a re-saved file the old file's; nothing crosses a mount (a
folder that is, or holds, a mount point is refused before the export, and a clean-up never removes a
volume's files); and the swap's fallback (two renames where ``renameat2(RENAME_EXCHANGE)`` is not
used) is taken for real, its crash between the renames repaired by the next write.

The mount cases mount a tmpfs or a bind mount, which needs root (CI runs as root); where the
system refuses, they skip saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import opreg
from opreg.exporter import _save
from opreg.llm import _folder
from tests.test_llm_folder import export_in_child, snapshot
from tests.test_streaming import example, make_block


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def program():
    return opreg.export(make_block(), (example(),))


def filler(program, external_data: bool = True):
    """What a folder write fills its new folder with: a model (and its data file) and a config."""

    def fill(staged: Path) -> list[str]:
        program.save(staged / "model.onnx", external_data=external_data)
        (staged / "genai_config.json").write_text("{}")
        return sorted(p.name for p in staged.iterdir())

    return fill


# -- permissions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder_mode", [0o700, 0o750, 0o755], ids=oct)
def test_a_folder_written_over_another_keeps_its_permissions_and_each_replaced_files(program, tmp_path, folder_mode):
    """Issue 53: a 0700 folder became 0755 (the umask's), and its files readable by all."""
    target = tmp_path / "genai"
    with umask(0o022):
        _folder.write_folder(target, filler(program))
        os.chmod(target / "model.onnx", 0o600)
        os.chmod(target / "genai_config.json", 0o640)
        (target / "notes.txt").write_text("the user's")
        os.chmod(target / "notes.txt", 0o604)
        os.chmod(target, folder_mode)
        _, written = _folder.write_folder(target, filler(program))
    data = [n for n in written if n.endswith(".data")]
    assert mode(target) == folder_mode
    assert {n: mode(target / n) for n in os.listdir(target)} == {
        "model.onnx": 0o600, data[0]: 0o600, "genai_config.json": 0o640, "notes.txt": 0o604
    }  # fmt: skip


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=oct)
def test_a_new_folder_and_new_files_get_what_the_umask_gives(program, tmp_path, mask):
    """The other side: with nothing replaced, nothing is copied; the umask decides, as for any new file."""
    target = tmp_path / "genai"
    with umask(mask):
        _, written = _folder.write_folder(target, filler(program))
    assert mode(target) == 0o777 & ~mask
    assert {mode(target / n) for n in written} == {0o666 & ~mask}


@pytest.mark.parametrize("external_data", [True, False])
def test_a_model_saved_over_another_keeps_its_permissions(program, tmp_path, external_data):
    """Issue 53: re-saving over a 0600 model left 0644; its data file, new, holds the same weights."""
    path = tmp_path / "m.onnx"
    with umask(0o022):
        program.save(path, external_data=external_data)
        assert mode(path) == 0o644  # new: the umask's
        os.chmod(path, 0o600)
        program.save(path, external_data=external_data)
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == dict.fromkeys(os.listdir(tmp_path), 0o600)
    assert len(os.listdir(tmp_path)) == (2 if external_data else 1)


# -- mounts --------------------------------------------------------------------------------------------------


@pytest.fixture
def mount(tmp_path):
    """``mount(path, *how)``: mount at ``path`` (made) with ``mount``'s arguments ``how`` (a tmpfs by default);
    everything mounted under ``tmp_path`` is unmounted afterwards, wherever a rename took it. Skips where this
    process may not mount."""
    from opreg.exporter import _mounts

    made = []

    def mount_at(path: Path, *how: str) -> Path:
        if not path.exists():
            path.mkdir(parents=True)
        how = how or ("-t", "tmpfs", "-o", "size=1m", "opreg-test")
        done = subprocess.run(["mount", *how, str(path)], capture_output=True, text=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount here (uid {os.getuid()}: {done.stderr.strip()}); the mount cases need root")
        made.append(path)
        return path

    yield mount_at
    for path in reversed(_mounts.mounts_at_or_under(tmp_path) if made else []):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def test_a_folder_holding_a_mounted_volume_is_refused_before_the_export_and_the_volume_kept(program, tmp_path, mount):
    """Issue 53: the volume's file was copied to the parent disk, the live mount moved into the staging
    folder and its file deleted by the clean-up."""
    target = tmp_path / "genai"
    _folder.write_folder(target, filler(program))
    volume = mount(target / "volume")
    (volume / "data.bin").write_bytes(b"the volume's")
    before = snapshot(target)
    with pytest.raises(opreg.SaveError, match=rf"{volume} inside it is a mount point.*unmount it or move it out"):
        _folder.check_folder(target)  # what `opreg llm export -o` runs before it exports

    def fill(staged: Path) -> list[str]:
        raise AssertionError("the export ran")

    with pytest.raises(opreg.SaveError, match="is a mount point"):
        _folder.write_folder(target, fill)
    assert snapshot(target) == before and (volume / "data.bin").read_bytes() == b"the volume's"
    assert os.listdir(tmp_path) == ["genai"]  # no staging folder, nothing copied beside


def test_a_volume_mounted_while_the_model_is_written_is_refused_before_the_swap(program, tmp_path, mount):
    """The folder is checked again just before the swap: the export can take minutes."""
    target = tmp_path / "genai"
    _folder.write_folder(target, filler(program))
    before = snapshot(target)

    def fill(staged: Path) -> list[str]:
        (mount(target / "volume") / "data.bin").write_bytes(b"the volume's")
        return filler(program)(staged)

    with pytest.raises(opreg.SaveError, match="volume inside it is a mount point"):
        _folder.write_folder(target, fill)
    assert (target / "volume" / "data.bin").read_bytes() == b"the volume's"
    assert {k: v for k, v in snapshot(target).items() if not k.startswith("volume")} == before
    assert os.listdir(tmp_path) == ["genai"]


def test_without_a_mount_table_a_folder_on_another_device_is_found(tmp_path, mount):
    """Where ``/proc/self/mountinfo`` is missing, a folder on another device than its parent is a mount
    point (a tmpfs is found, a bind mount of the same file system is not: the table is what finds those)."""
    from opreg.exporter import _mounts

    target = tmp_path / "genai"
    volume = mount(target / "volume")
    (tmp_path / "elsewhere").mkdir()
    mount(target / "linked", "--bind", str(tmp_path / "elsewhere"))
    assert _mounts._other_devices(target) == [volume]
    assert _mounts._other_devices(volume) == [volume]
    assert _mounts._other_devices(tmp_path / "missing") == []


def test_a_bind_mount_of_the_same_file_system_inside_is_refused_too(program, tmp_path, mount):
    """A bind mount shares its device with the folder (no ``st_dev`` differs): the mount table names it."""
    target = tmp_path / "genai"
    _folder.write_folder(target, filler(program))
    (tmp_path / "elsewhere").mkdir()
    mount(target / "linked", "--bind", str(tmp_path / "elsewhere"))
    with pytest.raises(opreg.SaveError, match=rf"{target / 'linked'} inside it is a mount point"):
        _folder.check_folder(target)


def test_a_folder_that_is_a_mount_point_is_refused_before_the_export(tmp_path, mount, capsys):
    from tests.test_cli import run

    target = mount(tmp_path / "genai")
    with pytest.raises(opreg.SaveError, match=rf"{target}: it is a mount point.*write to a folder inside it"):
        _folder.check_folder(target)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")  # not even read: the output is refused first
    code, _, err = run(capsys, "llm", "export", str(checkpoint), "-o", str(target), "-t", "onnx")
    assert code != 0 and "it is a mount point" in err
    _folder.check_folder(target / "model")  # the way out the message gives


def test_a_model_file_that_is_a_mount_point_is_refused_before_it_is_written(program, tmp_path, mount):
    (tmp_path / "source.onnx").write_bytes(b"elsewhere")
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    mount(path, "--bind", str(tmp_path / "source.onnx"))
    with pytest.raises(opreg.SaveError, match="it is a mount point"):
        _save.check_output_path(path)
    with pytest.raises(opreg.SaveError, match="it is a mount point"):
        program.save(path)
    assert (tmp_path / "source.onnx").read_bytes() == b"elsewhere"


def test_a_clean_up_never_removes_a_mounted_volume(tmp_path, mount, caplog):
    """A killed write's staging folder with a volume mounted in it (since) is left, with a warning."""
    target = tmp_path / "genai"
    stale = tmp_path / f"{_folder.staging_prefix(target)}1-x"
    volume = mount(stale / "folder" / "volume")
    (volume / "data.bin").write_bytes(b"the volume's")
    (stale / "lock").touch()  # its writer is gone: nobody holds the lock
    with caplog.at_level(logging.WARNING, logger="opreg.llm._folder"):
        _folder.clean_up(target)
    assert (volume / "data.bin").read_bytes() == b"the volume's"
    assert caplog.messages == [f"leaving {stale}: {volume} is mounted inside it (unmount it, then remove the folder)"]


def test_a_folder_holding_ordinary_folders_is_written_keeping_them(program, tmp_path):
    """The other side: a subfolder on the same mount is the folder's own, kept in the new folder."""
    target = tmp_path / "genai"
    _folder.write_folder(target, filler(program))
    (target / "sub").mkdir()
    (target / "sub" / "notes.txt").write_text("the user's")
    _folder.write_folder(target, filler(program))
    assert (target / "sub" / "notes.txt").read_text() == "the user's"


# -- the swap's fallback: two renames --------------------------------------------------------------------------

CHILD = """
import sys
from pathlib import Path
from opreg.llm import _folder

def fill(staged):
    (staged / "model.onnx").write_text("new")
    return ["model.onnx"]

_folder.write_folder(sys.argv[1], fill)
"""


@pytest.mark.parametrize("setting", [None, "0", "1"], ids=["unset", "0", "1"])
def test_the_fallback_swap_is_taken_when_the_exchange_is_turned_off(tmp_path, monkeypatch, caplog, setting):
    target = tmp_path / "genai"
    target.mkdir()
    (target / "model.onnx").write_text("old")
    (target / "notes.txt").write_text("the user's")
    if setting is not None:
        monkeypatch.setenv(_folder.NO_EXCHANGE_ENV, setting)

    def fill(staged: Path) -> list[str]:
        (staged / "model.onnx").write_text("new")
        return ["model.onnx"]

    with caplog.at_level(logging.DEBUG, logger="opreg.llm._folder"):
        _folder.write_folder(target, fill)
    fallback = [m for m in caplog.messages if "by two renames" in m]
    assert len(fallback) == (1 if setting == "1" else 0)
    assert {p.name: p.read_text() for p in target.iterdir()} == {"model.onnx": "new", "notes.txt": "the user's"}
    assert os.listdir(tmp_path) == ["genai"]


def test_a_write_killed_between_the_fallbacks_two_renames_is_repaired_by_the_next(tmp_path, monkeypatch):
    """Between the renames the target is missing and the old folder aside: the next write (or clean-up)
    to that target renames it back, exactly as it was, before anything else."""
    target = tmp_path / "genai"
    target.mkdir()
    (target / "model.onnx").write_text("old")
    before = snapshot(target)
    monkeypatch.setenv(_folder.NO_EXCHANGE_ENV, "1")
    argv = [sys.executable, "-c", CHILD, str(target)]
    code, err = export_in_child(target, 0, "folder-aside", signal.SIGKILL, argv)
    assert code == -signal.SIGKILL, err
    assert not target.exists()
    assert sorted(n.split("-")[0] for n in os.listdir(tmp_path)) == [".genai.opreg", ".genai.opreg"]  # aside, staging
    _folder.clean_up(target)
    assert snapshot(target) == before and os.listdir(tmp_path) == ["genai"]
