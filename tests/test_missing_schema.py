"""An impl that calls a custom-domain op by the name its ONNX schema gives (``msft.Gelu(x)``), where no
schema for it is registered, fails in one line naming the installed pack that registers it and the
spelling that needs none, instead of onnxscript's ``AttributeError: Attribute Gelu not found.``"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from onnxscript.values import Opset

import opreg

SPELLING = 'onnxscript.values.Op(opset, "{}")(...), which needs no schema'


def test_an_op_no_installed_pack_has_a_schema_for():
    msft = Opset("com.microsoft", 1)

    def aten_gelu_typo(self, approximate: str = "none"):
        """gelu(Tensor self, *, str approximate='none') -> Tensor: a name com.microsoft has no schema for."""
        return msft.Gelux(self)

    registry = opreg.default_registry().copy()
    registry.register("aten::gelu", aten_gelu_typo, domains={"com.microsoft": 1})
    with pytest.raises(opreg.ExportError) as caught:
        opreg.export(
            torch.nn.GELU(), (torch.randn(3),), registry=registry, target="onnx,com.microsoft=1"
        )  # no release: judged by schema only
    message = str(caught.value)
    assert "\n" not in message and "Attribute" not in message
    assert message.startswith("impl <user>:aten_gelu_typo for aten::gelu.default (node gelu")
    assert message.endswith(
        "com.microsoft::Gelux has no ONNX schema here, and no installed pack registers one: "
        f"write the call {SPELLING.format('Gelux')}"
    )


EXPORT_WITHOUT_CONTRIB = """
import torch
from onnxscript.values import Opset

import opreg

msft = Opset("com.microsoft", 1)


def aten_gelu_msft(self, approximate: str = "none"):
    return msft.Gelu(self)


registry = opreg.default_registry(exclude=["ort_contrib"]).copy()
registry.register("aten::gelu", aten_gelu_msft, domains={"com.microsoft": 1})
try:
    opreg.export(torch.nn.GELU(), (torch.randn(3),), registry=registry, target="onnx,com.microsoft=1")
except opreg.ExportError as e:
    print(e)
"""


def test_an_op_whose_schema_an_installed_pack_not_loaded_registers(tmp_path):
    """In a fresh process, so that no registry of this one has loaded opreg-ort-contrib's schemas."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXPORT_WITHOUT_CONTRIB)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith("impl <user>:aten_gelu_msft for aten::gelu.default (node gelu"), message
    assert message.endswith(
        "com.microsoft::Gelu has no ONNX schema in this export: pack ort_contrib (opreg-ort-contrib) registers "
        f"it and is not loaded (load it with -p, plugins=), or write the call {SPELLING.format('Gelu')}"
    )
