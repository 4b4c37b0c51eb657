"""What :meth:`OnnxProgram.locate` reports: each divergence, the error's path, and the verdict."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from opreg.exporter._rewrite import JOIN
from opreg.exporter.diagnosis.compare import Error

GROWTH_SHARE = 0.5
"""A step of the error's path that adds at least this share of the final error is where it 'grew most'
as a single jump; drift spreads its growth over many steps."""


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One FX node whose ONNX value is out of tolerance, and what made it.

    Fields:
        node: the FX node's name (also the ONNX value's, unless a pass renamed it).
        value: the ONNX value compared.
        torch_op: the torch op (``cond``, ``scan``, ... for control flow).
        pack / impl: the pack and the impl's label (``pack:function``) that translated it.
        impl_source: ``file:line`` of the impl's function.
        rules: the rewrite rules (``pack:rule``) that made ONNX nodes between the node's
            compared inputs and its value.
        onnx_ops: the ONNX ops between them (control flow: with its body's ops).
        body_impls: for control flow, the impls its body used.
        inner: for control flow at fault, the :class:`Location` inside its body: the body
            exported on its own (with the same registry and target) and located on the
            inputs of its first call (the branch taken, the first iteration).
        module / source: the model's module path and source line that made the node.
        error: its value against eager.
        local: its value against its torch op replayed on the ONNX model's own inputs to it
            (``None`` when it could not be replayed); out of tolerance: the node is at fault.
        first: its compared inputs agree with eager (the earliest divergences).
    """

    node: str
    value: str
    torch_op: str
    pack: str
    impl: str
    impl_source: str
    rules: tuple[str, ...]
    onnx_ops: tuple[str, ...]
    body_impls: tuple[str, ...]
    module: str
    source: str
    error: Error
    local: Error | None
    first: bool
    inner: Location | None = None

    @property
    def faulty(self) -> bool:
        """The node computes another function than its torch op on the same inputs."""
        return self.local is not None and not self.local.ok

    @property
    def suspect(self) -> str:
        """What to fix: the rewrite rules that made its nodes, else (control flow) what is wrong
        inside its body, else its impl."""
        if self.rules:
            return JOIN.join(self.rules)
        if self.inner is not None and self.inner.suspects:
            return JOIN.join(self.inner.suspects)
        return self.impl

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["error"] = dataclasses.asdict(self.error)
        data["local"] = dataclasses.asdict(self.local) if self.local is not None else None
        data["inner"] = self.inner.to_dict() if self.inner is not None else None
        data["faulty"], data["suspect"] = self.faulty, self.suspect
        return _finite(data)


@dataclasses.dataclass(frozen=True)
class Step:
    """One compared node on the error's path to an output: its error, and how much it added."""

    node: str
    torch_op: str
    impl: str
    ratio: float
    added: float


def tolerance_text(rtol: float | None, atol: float | None) -> str:
    """``rtol=0.0001, atol=0.0001``; a tolerance not given is its value's dtype's default (torch.testing's)."""
    if rtol is None and atol is None:
        return "each dtype's default tolerances"
    shown = ["by dtype" if v is None else format(v, "g") for v in (rtol, atol)]
    return f"rtol={shown[0]}, atol={shown[1]}"


@dataclasses.dataclass(frozen=True)
class Location:
    """The result of :meth:`OnnxProgram.locate`.

    Fields:
        runtime / rtol / atol: what the values were compared with (``None``: each value's dtype's
            default, :data:`opreg.exporter.diagnosis.compare.DEFAULT_TOLERANCES`).
        compared: how many FX nodes' values were compared.
        divergences: every node out of tolerance, in graph order.
        path: from the input to the output with the largest error, the compared nodes
            the error travelled through (each with what it added, in tolerance units).
        notes: what was not compared, and why.
    """

    runtime: str
    rtol: float | None
    atol: float | None
    compared: int
    divergences: tuple[Divergence, ...]
    path: tuple[Step, ...]
    notes: tuple[str, ...] = ()

    @property
    def first(self) -> tuple[Divergence, ...]:
        """The earliest divergences: nodes whose compared inputs agree and whose outputs do not."""
        return tuple(d for d in self.divergences if d.first)

    @property
    def culprits(self) -> tuple[Divergence, ...]:
        """The nodes that compute another function than torch on the same inputs."""
        return tuple(d for d in self.divergences if d.faulty)

    @property
    def suspects(self) -> tuple[str, ...]:
        """The impls (``pack:function``) and rewrite rules (``pack:rule``) at fault, in graph order."""
        seen: list[str] = []
        for d in self.culprits:
            if d.suspect not in seen:
                seen.append(d.suspect)
        return tuple(seen)

    @property
    def verdict(self) -> str:
        """``fault`` (a node is wrong), ``drift`` (values drift out of tolerance, no node is wrong) or ``ok``."""
        if self.culprits:
            return "fault"
        return "drift" if self.divergences else "ok"

    @property
    def grew_most(self) -> Step | None:
        """The step of :attr:`path` that added the most error."""
        return max(self.path, key=lambda s: s.added, default=None)

    def summary(self) -> str:
        """What the report says, in a few lines."""
        tol = tolerance_text(self.rtol, self.atol)
        if self.compared == 0:
            return "\n".join(["no intermediate value could be compared with eager PyTorch", *self.notes])
        if self.verdict == "ok":
            return "\n".join(
                [f"every one of {self.compared} intermediate values matches eager PyTorch ({self.runtime}, {tol})",
                 *self.notes]
            )  # fmt: skip
        lines = []
        if self.culprits:
            for d in self.culprits:
                if d.inner is not None and d.inner.culprits:
                    inner = "\n  ".join(d.inner.summary().splitlines())
                    lines.append(f"{d.torch_op} at node {d.node} ({_where(d)}) differs from eager; inside its body:")
                    lines.append(f"  {inner}")
                    continue
                lines.append(
                    f"{d.suspect} is wrong at node {d.node} ({d.torch_op}, {_where(d)}): {d.error}; "
                    f"given the model's own inputs to it, still {d.local}"
                    + (f" [impl {d.impl} at {d.impl_source}]" if d.rules and d.impl_source else "")
                    + (f" [impl at {d.impl_source}]" if not d.rules and d.impl_source else "")
                )
        else:
            first = self.first[0] if self.first else self.divergences[0]
            lines.append(
                f"no node computes another function than torch: the values drift out of tolerance ({tol}), "
                f"first at node {first.node} ({first.torch_op}, {_where(first)}): {first.error}"
            )
        grew = self.grew_most
        largest = max((s.ratio for s in self.path), default=0.0)
        if grew is not None and math.isfinite(largest):
            share = min(grew.added / max(largest, 1e-30), 1.0)
            spread = "in one step" if share >= GROWTH_SHARE else f"spread along {len(self.path)} nodes"
            lines.append(
                f"the error grew most at node {grew.node} ({grew.torch_op}, +{grew.added:.3g} x the tolerance, "
                f"{share:.0%} of the largest error on the path), {spread}"
            )
        elif grew is not None:  # a zero tolerance (or a wrong shape): any difference is infinitely many
            lines.append(
                f"the error is beyond any multiple of the tolerance from node {grew.node} ({grew.torch_op}) on, "
                f"along {len(self.path)} nodes of the path"
            )
        lines.extend(self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` prints)."""
        grew = self.grew_most
        return _finite({
            "verdict": self.verdict,
            "runtime": self.runtime,
            "rtol": self.rtol,
            "atol": self.atol,
            "compared": self.compared,
            "suspects": list(self.suspects),
            "divergences": [d.to_dict() for d in self.divergences],
            "path": [dataclasses.asdict(s) for s in self.path],
            "grew_most": dataclasses.asdict(grew) if grew is not None else None,
            "notes": list(self.notes),
        })  # fmt: skip


def _where(d: Divergence) -> str:
    return " at ".join(p for p in (d.module or "<root>", d.source) if p)


def _finite(data: Any) -> Any:
    """JSON has no infinity: ``inf`` becomes the string ``"inf"``."""
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data
