"""``OnnxProgram.save``: the model and its external data are always a consistent pair,
also when a save fails or its process is interrupted or killed at any point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import opreg
from opreg.exporter import _save

WIDTH = 256
"""A Linear of 256x256 float32: 256 KB of weights, so they go to the data file."""


def linear(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(WIDTH, WIDTH).eval()


X = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(7))


def run_saved(path: Path) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": X.numpy()})[0]  # Linear.forward(input)


def matches(path: Path, seed: int) -> bool:
    """Whether the model at ``path`` computes what ``linear(seed)`` computes."""
    with torch.no_grad():
        expected = linear(seed)(X).numpy()
    return bool(np.allclose(run_saved(path), expected, atol=1e-5))


def data_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".data"))


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_each_save_names_a_new_data_file_and_removes_the_replaced_one(tmp_path):
    path = tmp_path / "m.onnx"
    opreg.export(linear(1), (X,)).save(path, external_data=True)
    (first,) = data_files(tmp_path)
    assert _save.data_file_pattern("m.onnx").match(first)
    assert _save.referenced_data(path) == {first}
    assert matches(path, 1)

    opreg.export(linear(2), (X,)).save(path, external_data=True)
    (second,) = data_files(tmp_path)
    assert second != first and _save.referenced_data(path) == {second}
    assert matches(path, 2)
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("external_data", [False, True], ids=["inline", "external"])
def test_the_new_model_is_renamed_into_place(tmp_path, external_data):
    """Replacing the model is one rename, never a write into the file at ``path``: the path gets a
    new inode, and a reader that opened the old model keeps reading it whole (a copy onto the path
    would truncate and rewrite the very file that reader holds)."""
    path = tmp_path / "m.onnx"
    opreg.export(linear(1), (X,)).save(path, external_data=external_data)
    with open(path, "rb") as reader:
        old = os.fstat(reader.fileno())
        before = reader.read()
        opreg.export(linear(2), (X,)).save(path, external_data=external_data)
        assert os.stat(path).st_ino != old.st_ino
        assert os.fstat(reader.fileno()).st_nlink == 0  # the old file left the folder, unchanged
        reader.seek(0)
        assert reader.read() == before and os.fstat(reader.fileno()).st_size == old.st_size
    assert matches(path, 2)


def test_weights_over_the_threshold_go_to_a_data_file_unasked(tmp_path, monkeypatch):
    """``save(path)`` writes the weights to a data file when they exceed EXTERNAL_DATA_THRESHOLD
    (90% of the 2 GB one protobuf holds). Here the threshold is set just below and at this model's
    256 KB of weights, so as not to write 2 GB."""
    import onnx

    from opreg.exporter import _program

    assert 0.8 * onnx.checker.MAXIMUM_PROTOBUF < _program.EXTERNAL_DATA_THRESHOLD < onnx.checker.MAXIMUM_PROTOBUF
    program = opreg.export(linear(1), (X,))
    size = program.initializer_bytes()
    assert size == (WIDTH * WIDTH + WIDTH) * 4
    monkeypatch.setattr(_program, "EXTERNAL_DATA_THRESHOLD", size - 1)
    big = program.save(tmp_path / "big.onnx")
    (data,) = data_files(tmp_path)
    assert _save.referenced_data(big) == {data} and (tmp_path / data).stat().st_size >= WIDTH * WIDTH * 4
    assert matches(big, 1)
    monkeypatch.setattr(_program, "EXTERNAL_DATA_THRESHOLD", size)
    small = program.save(tmp_path / "small.onnx")
    assert _save.referenced_data(small) == set() and data_files(tmp_path) == [data]
    assert matches(small, 1)


def test_saving_without_external_data_removes_the_earlier_data_file(tmp_path):
    path = tmp_path / "m.onnx"
    opreg.export(linear(1), (X,)).save(path, external_data=True)
    opreg.export(linear(2), (X,)).save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    assert matches(path, 2)


def test_small_weights_write_no_empty_data_file(tmp_path):
    path = opreg.export(torch.nn.Linear(2, 2).eval(), (torch.randn(1, 2),)).save(
        tmp_path / "m.onnx", external_data=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # onnx_ir keeps tensors < 256 bytes inline
    assert _save.referenced_data(path) == set()


def test_a_symlink_is_written_through_and_refused_for_external_data(tmp_path):
    real = tmp_path / "store" / "m.onnx"
    real.parent.mkdir()
    link = tmp_path / "m.onnx"
    link.symlink_to(real)
    program = opreg.export(linear(1), (X,))
    assert program.save(link) == real
    assert link.is_symlink() and matches(link, 1)
    # onnx and onnxruntime look for data files beside the path they open: the link's folder
    with pytest.raises(opreg.SaveError, match="symbolic link.*save to .*store/m.onnx"):
        program.save(link, external_data=True)
    assert link.is_symlink() and sorted(p.name for p in real.parent.iterdir()) == ["m.onnx"]


def test_a_model_that_fails_its_check_replaces_nothing(tmp_path):
    path = tmp_path / "m.onnx"
    opreg.export(linear(1), (X,)).save(path, external_data=True)
    before = sorted(tmp_path.iterdir())
    program = opreg.export(linear(2), (X,))
    program.model.graph.node(0).op_type = "NoSuchOp"  # checked again because the model was edited
    program._checked = False
    with pytest.raises(opreg.ExportError, match="not valid ONNX"):
        program.save(path, external_data=True)
    assert sorted(tmp_path.iterdir()) == before and matches(path, 1)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("folder", "it is a directory"),
        ("missing/m.onnx", "does not exist; create it first"),
        ("/proc/m.onnx", "cannot create files in /proc"),
        ("/sys/m.onnx", "cannot create files in /sys"),
    ],
)
def test_unwritable_locations_are_refused_before_anything_is_written(tmp_path, where, message):
    (tmp_path / "folder").mkdir()
    target = Path(where) if where.startswith("/") else tmp_path / where
    with pytest.raises(opreg.SaveError, match=message) as caught:
        _save.check_output_path(target)
    assert ".opreg-staging" not in str(caught.value)
    with pytest.raises(opreg.SaveError, match=message):
        opreg.export(linear(1), (X,)).save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


# -- interrupts: a real process, really signalled, at a point the test chooses ------------------------

CHILD = textwrap.dedent(
    """
    import sys, torch, opreg
    torch.manual_seed(int(sys.argv[2]))
    model = torch.nn.Linear({width}, {width}).eval()
    program = opreg.export(model, (torch.randn(2, {width}),))
    print("exported", flush=True)
    try:
        program.save(sys.argv[1], external_data=True)
    except KeyboardInterrupt as e:
        print(f"raised {{type(e).__name__}}; by {{e.__cause__ or e}}", file=sys.stderr, flush=True)
        sys.exit(130)
    print("saved", flush=True)
    """
).format(width=WIDTH)


def save_here(path: Path, seed: int) -> None:
    opreg.export(linear(seed), (X,)).save(path, external_data=True)


def save_in_child(
    path: Path, seed: int, pause: str | None, sig: signal.Signals | None, argv: list[str] | None = None
) -> tuple[int, str]:
    """Save ``linear(seed)`` to ``path`` in a child process (or run ``argv``); at each stage
    of ``pause`` (comma-separated) send ``sig`` when the save reaches it. Returns the child's
    exit code and the rest of its stderr."""
    script = path.parent / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, _save.PAUSE_ENV: pause or ""}
    child = subprocess.Popen(
        argv or [sys.executable, str(script), str(path), str(seed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in pause.split(",") if pause else ():
            deadline = time.monotonic() + 300
            line = ""
            while "paused" not in line:
                assert time.monotonic() < deadline, "the save never reached its pause"
                line = child.stderr.readline()
                assert line or child.poll() is None, f"the child ended before pausing: {child.stderr.read()}"
            child.send_signal(sig)
        code = child.wait(timeout=300)
        return code, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
        script.unlink()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("pause", ["staged", "data-moved", "model-moved"])
def test_an_interrupted_save_leaves_a_consistent_pair(tmp_path, pause, sig):
    path = tmp_path / "m.onnx"
    save_here(path, 1)
    assert matches(path, 1)
    (old,) = data_files(tmp_path)

    code, err = save_in_child(path, 2, pause, sig)
    # The signal ended the child, not an error: SIGKILL kills it; SIGTERM (which the save turns into
    # KeyboardInterrupt) and SIGINT raise KeyboardInterrupt, the only exception the child exits 130 on.
    assert code == (-signal.SIGKILL if sig is signal.SIGKILL else 130), (code, err)
    if sig is signal.SIGTERM:
        assert "by signal SIGTERM" in err, err
    # Whatever the instant, the model on disk computes with its own weights: the old pair, or the new.
    switched = pause == "model-moved"
    assert matches(path, 2 if switched else 1)
    assert _save.referenced_data(path) <= set(data_files(tmp_path))
    if sig is signal.SIGKILL:
        left = hidden(tmp_path)
        assert left == [] or all(name.startswith(_save.STAGING_PREFIX) for name in left)
        # Any later save in the folder, of any name, removes what the killed one left.
        save_here(tmp_path / "other.onnx", 4)
        owned = _save.referenced_data(path) | _save.referenced_data(tmp_path / "other.onnx")
        assert hidden(tmp_path) == [] and set(data_files(tmp_path)) == owned
    else:  # SIGTERM and SIGINT clean up: no staging folder, no orphan data file, and say which it was
        assert hidden(tmp_path) == []
        assert set(data_files(tmp_path)) == _save.referenced_data(path)
        assert (old in data_files(tmp_path)) is not switched
        assert f"raised {'InterruptedAfterSave' if switched else 'KeyboardInterrupt'}" in err

    # The next save cleans whatever a killed save left: staging folders and orphaned data files.
    save_here(path, 3)
    assert matches(path, 3)
    owned = _save.referenced_data(path) | _save.referenced_data(tmp_path / "other.onnx")
    assert hidden(tmp_path) == [] and set(data_files(tmp_path)) == owned


def test_a_second_interrupt_during_the_clean_up_leaves_the_journal_for_the_next_save(tmp_path):
    path = tmp_path / "m.onnx"
    save_here(path, 1)
    (old,) = data_files(tmp_path)
    code, err = save_in_child(path, 2, "model-moved,settle", signal.SIGINT)
    assert code == 130 and "raised InterruptedAfterSave" in err
    assert matches(path, 2) and old in data_files(tmp_path)  # its removal was cut short
    (staging,) = hidden(tmp_path)
    assert sorted(p.name for p in (tmp_path / staging).iterdir()) == ["journal.json", "lock"]  # the model is gone
    save_here(tmp_path / "other.onnx", 3)  # any save in the folder finishes it
    assert hidden(tmp_path) == [] and old not in data_files(tmp_path) and matches(path, 2)


@pytest.mark.parametrize(
    ("pause", "message"),
    [
        ("staged", "m.onnx was not changed"),
        ("data-moved", "m.onnx was not changed"),
        ("model-moved", "m.onnx holds the new model (saved before the interrupt)"),
    ],
)
def test_the_command_line_says_what_an_interrupt_left(tmp_path, pause, message):
    path = tmp_path / "m.onnx"
    save_here(path, 1)
    make = f"return torch.nn.Linear({WIDTH}, {WIDTH}).eval(), (torch.randn(2, {WIDTH}),)"
    (tmp_path / "models.py").write_text(f"import torch\n\n\ndef make():\n    {make}\n")
    argv = [sys.executable, "-m", "opreg", "export", f"{tmp_path}/models.py:make", "-o", str(path), "--external-data"]
    code, err = save_in_child(path, 0, pause, signal.SIGINT, argv)
    lines = [line for line in err.splitlines() if line.startswith("opreg:") and "paused" not in line]
    assert code == 130 and lines == [f"opreg: interrupted: {path.parent}/{message}"], err
    assert hidden(tmp_path) == [] and set(data_files(tmp_path)) == _save.referenced_data(path)
    assert matches(path, 1) is (pause != "model-moved")


# -- a save removes only what opreg wrote for this path ---------------------------------------------


def foreign_model(path: Path, location: str) -> None:
    """A model from elsewhere whose one weight is external data at ``location``."""
    import onnx
    from onnx import helper

    weight = helper.make_tensor("w", onnx.TensorProto.FLOAT, [1], [0.0])
    weight.data_location = onnx.TensorProto.EXTERNAL
    del weight.float_data[:]
    weight.external_data.add(key="location", value=location)
    weight.external_data.add(key="length", value="4")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "foreign",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [weight],
    )
    onnx.save(helper.make_model(graph), str(path))


@pytest.mark.parametrize("location", ["victim.txt", "m.onnx.data", "m.onnx.0badf00d.data"])
def test_replacing_a_model_from_elsewhere_deletes_none_of_its_files(tmp_path, location):
    path = tmp_path / "m.onnx"
    foreign_model(path, location)
    for name in {location, "m.onnx.data", "m.onnx.0badf00d.data"}:  # files a careless clean-up would take
        (tmp_path / name).write_bytes(b"user data")
    before = {p.name for p in tmp_path.iterdir()}
    opreg.export(linear(1), (X,)).save(path, external_data=True)
    (ours,) = _save.referenced_data(path)
    assert {p.name for p in tmp_path.iterdir()} == before | {ours}
    assert (tmp_path / location).read_bytes() == b"user data"
    assert matches(path, 1)


def test_a_copy_of_a_saved_model_keeps_its_data_when_the_original_is_saved_again(tmp_path):
    path = tmp_path / "m.onnx"
    opreg.export(linear(1), (X,)).save(path, external_data=True)
    backup = tmp_path / "m_backup.onnx"
    backup.write_bytes(path.read_bytes())  # cp m.onnx m_backup.onnx
    opreg.export(linear(2), (X,)).save(path, external_data=True)
    assert matches(path, 2) and matches(backup, 1)
    assert set(data_files(tmp_path)) == _save.referenced_data(path) | _save.referenced_data(backup)


def test_the_model_names_the_data_file_it_owns(tmp_path):
    import onnx

    path = opreg.export(linear(1), (X,)).save(tmp_path / "m.onnx", external_data=True)
    proto = onnx.load(str(path), load_external_data=False)
    owner = {p.key: p.value for p in proto.metadata_props}[_save.OWNED_DATA_KEY]
    assert {owner} == _save.referenced_data(path) == _save.owned_data(path)


def test_a_live_save_keeps_its_staging_folder_whatever_its_pid_says(tmp_path):
    """A save in another PID namespace (another container on a shared volume) has a PID that
    means nothing here: its folder is kept because it holds the folder's lock."""
    import fcntl

    staging = tmp_path / f"{_save.STAGING_PREFIX}999999999-live"
    staging.mkdir()
    (staging / "m.onnx").write_bytes(b"half written")
    fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the other save holds it
        opreg.export(linear(1), (X,)).save(tmp_path / "m.onnx", external_data=True)
        assert (staging / "m.onnx").read_bytes() == b"half written"
    finally:
        os.close(fd)
    opreg.export(linear(2), (X,)).save(tmp_path / "m.onnx", external_data=True)  # now it is stale
    assert not staging.exists()
