"""No first-party code changes the process's global state (issue 41): the logging configuration,
the warnings filters, torch's settings, ``sys.path``, the random generators, the environment and
the garbage collector are the same after an export as before it.

One fresh process (so that what opreg's modules do when first imported counts too) snapshots
them, exports a small model (with ``verify``, ``locate``, ``run``, opreg-ort-contrib's
``MatMulNBitsQuantization`` pass) and a tiny language model (``opreg.llm.export_decoder`` and its
``verify``), snapshots them again and reports each kind that differs; one test per kind reads it.
Before the first snapshot the process runs one bare ``torch.export.export`` (torch sets up its own
trace logging there) and builds the language model (transformers' import is the test's, not opreg's).
What opreg keeps on purpose is left out: the pytree classes it registers (docs/exporting.md) and
the modules it imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import gc, json, logging, os, random, signal, sys, tempfile, warnings
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import torch

    def loggers():
        found = {"": logging.getLogger()}
        found.update((n, l) for n, l in logging.Logger.manager.loggerDict.items() if isinstance(l, logging.Logger))
        return {n: (l.level, tuple(map(id, l.handlers)), l.propagate, l.disabled) for n, l in found.items()}

    def torch_settings():
        import torch._dynamo.config, torch._export.config, torch._functorch.config, torch.fx.experimental._config
        configs = {m.__name__: m.get_config_copy() for m in (torch._dynamo.config, torch._export.config,
                   torch._functorch.config, torch.fx.experimental._config)}
        return {**{k: repr(v) for k, v in configs.items()}, "default dtype": str(torch.get_default_dtype()),
                "grad": torch.is_grad_enabled(), "threads": torch.get_num_threads(),
                "interop threads": torch.get_num_interop_threads(),
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                "inference mode": torch.is_inference_mode_enabled(), "anomaly": torch.is_anomaly_enabled(),
                "default device": str(torch.get_default_device())}

    def snapshot():
        return {
            "logging": (loggers(), logging.root.manager.disable),
            "warnings": [repr(f) for f in warnings.filters],
            "torch": torch_settings(),
            "sys.path": list(sys.path),
            "random": (torch.random.get_rng_state().tolist(), repr(np.random.get_state()), random.getstate()),
            "environ": dict(os.environ),
            "gc": (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()),
            "signals": [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        }

    def differences(before, after):
        if before["logging"][0] != after["logging"][0]:  # loggers made since (modules imported) are not changes
            old, new = before["logging"][0], after["logging"][0]
            changed = sorted(n for n in old if new.get(n) != old[n])
            if not changed and before["logging"][1] == after["logging"][1]:
                after["logging"] = before["logging"]
        return {k: f"{str(before[k])[:300]} -> {str(after[k])[:300]}" for k in before if before[k] != after[k]}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 8)

        def forward(self, x):
            return torch.relu(self.fc(x)).unsqueeze(0)

    torch.manual_seed(0)
    x, net = torch.randn(2, 32), Net().eval()  # made before: a model's initial weights draw random numbers
    x3 = torch.randn(2, 4, 32)  # a 3-D input: the Linear is a MatMul (a 2-D one is a Gemm)
    torch.export.export(net, (x,))
    from tests import language_models as lm
    llm = lm.causal_lm("llama")
    before = snapshot()

    import opreg
    from opreg_ort_contrib import MatMulNBitsQuantization
    program = opreg.export(net, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    program.verify(x)
    program.locate(x)
    program.run(x)
    quantized = opreg.export(net, (x3,), target="onnxruntime", passes=[MatMulNBitsQuantization()])
    assert any(n.op_type == "MatMulNBits" for n in quantized.model.graph), "the pass quantized nothing"
    quantized.verify(x3, atol=0.5)  # int4 weights: the numbers are not what this test checks
    with tempfile.TemporaryDirectory() as folder:
        opreg.llm.export_decoder(llm, folder).verify()

    print(json.dumps(differences(before, snapshot())))
    """
)

KINDS = ("logging", "warnings", "torch", "sys.path", "random", "environ", "gc", "signals")


@pytest.fixture(scope="module")
def changed(tmp_path_factory) -> dict[str, str]:
    """What differs after the exports, by kind (one fresh process for them all)."""
    folder = tmp_path_factory.mktemp("state")
    script = folder / "exports.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=900, cwd=folder, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", KINDS)
def test_an_export_leaves_the_process_as_it_found_it(changed, kind):
    """Round 4: ONNX Runtime's quantizer import (MatMulNBitsQuantization) switched logging to INFO
    and extended sys.path; export_decoder drew its example inputs from torch's global generator."""
    assert kind not in changed, changed[kind]
