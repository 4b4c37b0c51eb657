"""A GenAI folder is never half-written: an export over an existing folder that fails, is
interrupted (SIGTERM, Ctrl-C) or killed (SIGKILL) at any point leaves the old folder exactly as it
was, or the complete new one; what a killed export leaves beside it, the next one removes.

Each interrupted export runs in a child process that pauses at a stage of the save
(``OPREG_SAVE_PAUSE``) until the test signals it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import opreg
from opreg.exporter import _save
from opreg.llm import _folder, _genai
from tests import language_models as lm

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys
import opreg
from tests import language_models as lm

model = lm.causal_lm("llama", seed=int(sys.argv[2]))
decoder = opreg.llm.export_decoder(model, target="onnx", tokenizer=lm.tokenizer())
try:
    decoder.save(sys.argv[1])
except KeyboardInterrupt as e:
    print(f"raised {type(e).__name__}", file=sys.stderr, flush=True)
    sys.exit(130)
"""


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name) and a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def embedding_of(folder: Path) -> np.ndarray:
    """The embedding table of the decoder in ``folder`` (the one initializer of shape (vocab, hidden))."""
    graph = onnx.load(str(folder / "model.onnx")).graph
    (table,) = [t for t in graph.initializer if list(t.dims) == [lm.VOCAB, 64]]
    return onnx.numpy_helper.to_array(table)


def holds(folder: Path, seed: int) -> bool:
    """Whether ``folder`` is a complete export of ``lm.causal_lm("llama", seed)``."""
    expected = lm.causal_lm("llama", seed=seed).model.embed_tokens.weight.detach().numpy()
    config = json.loads((folder / "genai_config.json").read_text())
    return config["model"]["decoder"]["filename"] == "model.onnx" and np.array_equal(embedding_of(folder), expected)


def export_here(folder: Path, seed: int) -> list[str]:
    """Export ``llama(seed)`` to ``folder`` in this process; the names the save wrote."""
    decoder = opreg.llm.export_decoder(lm.causal_lm("llama", seed=seed), target="onnx", tokenizer=lm.tokenizer())
    return _genai.save(decoder, folder)[1]


def beside(folder: Path) -> list[str]:
    """What else is in ``folder``'s parent: staging folders a save left."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


def export_in_child(
    folder: Path, seed: int, pause: str, sig: signal.Signals, argv: list[str] | None = None
) -> tuple[int, str]:
    """Export ``llama(seed)`` over ``folder`` in a child (or run ``argv``); send ``sig`` when its
    save reaches ``pause``. The child's exit code and the rest of its stderr."""
    env = {**os.environ, _save.PAUSE_ENV: pause, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        argv or [sys.executable, "-c", CHILD, str(folder), str(seed)], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline, line = time.monotonic() + 300, ""
        while "paused" not in line:
            assert time.monotonic() < deadline, "the save never reached its pause"
            line = child.stderr.readline()
            assert line or child.poll() is None, f"the child ended before pausing: {child.stderr.read()}"
        child.send_signal(sig)
        return child.wait(timeout=300), child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()


@pytest.fixture(scope="module")
def old_folder(tmp_path_factory) -> Path:
    """An export of ``llama(seed=1)`` with a file of the user's beside it."""
    folder = tmp_path_factory.mktemp("old") / "genai"
    export_here(folder, 1)
    (folder / "notes.txt").write_text("the user's")
    return folder


@pytest.mark.parametrize(
    ("pause", "sig"),
    [
        ("staged", signal.SIGKILL),  # the model file is being written (the tokenizer is)
        ("folder-staged", signal.SIGKILL),  # the whole new folder is written, not yet in place
        ("folder-swapped", signal.SIGTERM),  # the new folder is in place; the old one not yet removed
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_an_interrupted_export_leaves_the_old_folder_or_the_new_one_whole(old_folder, tmp_path, pause, sig):
    folder = tmp_path / "genai"
    shutil.copytree(old_folder, folder, symlinks=True)
    before = snapshot(folder)
    code, err = export_in_child(folder, 2, pause, sig)
    assert code == (-signal.SIGKILL if sig is signal.SIGKILL else 130), (code, err)
    switched = pause == "folder-swapped"
    if switched:  # the complete new folder, the user's file kept
        assert holds(folder, 2) and (folder / "notes.txt").read_text() == "the user's"
    else:  # exactly as it was
        assert snapshot(folder) == before
    if sig is signal.SIGTERM:  # cleaned up, and says whether the new folder is in place
        assert f"raised {'InterruptedAfterSave' if switched else 'KeyboardInterrupt'}" in err, err
        assert beside(folder) == []
    else:  # killed: its staging folder stays, for the next export to remove
        assert [name.startswith(_folder.staging_prefix(folder)) for name in beside(folder)] == [True]
        written = export_here(folder, 3)
        assert beside(folder) == [] and holds(folder, 3)
        data = [name for name in written if name.endswith(".data")]
        assert written == sorted(["genai_config.json", "model.onnx", *data, "tokenizer.json", "tokenizer_config.json"])
        assert [_save.data_file_pattern("model.onnx").match(name) is not None for name in data] == [True]
        assert sorted(os.listdir(folder)) == sorted([*written, "notes.txt"])


@pytest.mark.parametrize(
    ("pause", "sig", "message"),
    [
        ("staged", signal.SIGTERM, "{folder} was not changed"),
        ("folder-swapped", signal.SIGINT, "{folder} holds the new model folder (saved before the interrupt)"),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_the_command_line_says_what_an_interrupt_left(old_folder, tmp_path, pause, sig, message):
    folder = tmp_path / "out" / "genai"
    shutil.copytree(old_folder, folder, symlinks=True)
    before = snapshot(folder)
    checkpoint = lm.checkpoint(lm.causal_lm("llama", seed=2), tmp_path / "checkpoint")
    argv = [sys.executable, "-m", "opreg", "llm", "export", str(checkpoint), "-o", str(folder), "-t", "onnx"]
    code, err = export_in_child(folder, 2, pause, sig, argv)
    lines = [line for line in err.splitlines() if line.startswith("opreg:") and "paused" not in line]
    assert code == 130 and lines == [f"opreg: interrupted: {message.format(folder=folder)}"], err
    assert beside(folder) == []
    if pause == "staged":
        assert snapshot(folder) == before
    else:
        assert holds(folder, 2) and (folder / "notes.txt").read_text() == "the user's"


def test_a_failed_export_over_a_folder_changes_nothing(old_folder, tmp_path):
    folder = tmp_path / "genai"
    shutil.copytree(old_folder, folder, symlinks=True)
    before = snapshot(folder)
    with pytest.raises(opreg.ExportError, match="tokenizer= takes a transformers tokenizer"):
        opreg.llm.export_decoder(lm.causal_lm("llama"), folder, target="onnx", tokenizer=object())
    assert snapshot(folder) == before and beside(folder) == []
    with pytest.raises(opreg.ExportError, match="tokenizer= takes a transformers tokenizer"):
        opreg.llm.export_decoder(lm.causal_lm("llama"), tmp_path / "new", target="onnx", tokenizer=object())
    assert sorted(os.listdir(tmp_path)) == ["genai"]  # no new folder, no staging folder


def test_a_live_exports_staging_folder_is_not_removed_and_foreign_entries_never(tmp_path):
    folder = tmp_path / "genai"
    live = tmp_path / f"{_folder.staging_prefix(folder)}123-live"
    live.mkdir()
    lock = os.open(live / "lock", os.O_RDWR | os.O_CREAT)
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        foreign = [tmp_path / ".genai.something-else", tmp_path / f"{_folder.staging_prefix(tmp_path / 'other')}1-x"]
        for path in foreign:
            path.mkdir()
        _folder.clean_up(folder)
        assert live.is_dir() and all(path.is_dir() for path in foreign)
    finally:
        os.close(lock)
    _folder.clean_up(folder)  # its writer is gone
    assert not live.exists() and all(path.is_dir() for path in foreign)


CUSTOM_CODE = """
import pathlib

pathlib.Path({sentinel!r}).write_text("the checkpoint's code ran")
from transformers import LlamaConfig, LlamaForCausalLM


class MyConfig(LlamaConfig):
    model_type = "mycustom"


class MyModel(LlamaForCausalLM):
    config_class = MyConfig
"""


@pytest.mark.parametrize("model_type", ["mycustom", "llama"], ids=["custom-type", "known-type"])
def test_a_checkpoint_carrying_code_is_refused_before_transformers_can_ask_to_run_it(tmp_path, model_type):
    """Issue 53: transformers' "run the custom code? [y/N]" prompt reached opreg's stdin, and a `y` ran the
    checkpoint's code. A config.json with an auto_map is refused before transformers reads it, with a `y` on
    stdin, whether its model_type is transformers' own or the checkpoint's."""
    folder = lm.checkpoint(lm.causal_lm("llama"), tmp_path / "checkpoint")
    sentinel = tmp_path / "RAN"
    (folder / "custom_x.py").write_text(CUSTOM_CODE.format(sentinel=str(sentinel)))
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": model_type, "auto_map": {"AutoConfig": "custom_x.MyConfig",
                                                      "AutoModelForCausalLM": "custom_x.MyModel"}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        [sys.executable, "-m", "opreg", "llm", "export", str(folder), "-o", str(tmp_path / "out")],
        input="y\n", capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert ran.returncode == 2 and not sentinel.exists() and not (tmp_path / "out").exists(), ran.stderr
    assert "[y/N]" not in ran.stdout + ran.stderr
    assert "maps transformers' classes to code in the checkpoint (auto_map: AutoConfig -> custom_x.MyConfig, " in (
        ran.stderr
    )
    assert "opreg runs no code a checkpoint carries" in ran.stderr
    with pytest.raises(opreg.ExportError, match="opreg runs no code a checkpoint carries"):
        opreg.llm.export_checkpoint(folder)  # the same refusal in Python
    assert not sentinel.exists()
