"""Named dims refined as torch.export suggests (docs/exporting.md, "Dynamic shapes"): when the model's
guards break the range a user gave a named ``Dim`` (``Dim("sequence")`` on a BERT, whose position
table holds 128: "Constraints violated (sequence) ... Suggested fixes: sequence = Dim('sequence',
max=128)"), the capture is run again with torch's suggested fixes applied
(``torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes``, as torch.onnx does), and
each refined dim is reported: in the log, on the program (``refined_dims``), in the model's
metadata and by ``opreg export``. A fix that would make a dim static is not applied: the capture's
error, which names the guard, stands.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import torch

from opreg.errors import ExportError

logger = logging.getLogger(__name__)

REFINED_DIMS_KEY = "opreg.refined_dims"
"""The model's metadata: the named dims torch.export's suggested fixes refined, a JSON list of
``{name, asked, refined, reason}`` (:class:`RefinedDim`)."""

_FIX = re.compile(r"^\s*(?P<name>\w+) = (?P<value>.+?)\s*$")


@dataclasses.dataclass(frozen=True)
class RefinedDim:
    """A named dim whose range torch.export's suggested fix changed.

    Fields:
        name: the ``Dim``'s name.
        asked: its range as given (``Dim('sequence')``).
        refined: as captured (``Dim('sequence', max=128)``, or a relation such as ``dx + 1``).
        reason: torch's words for the guard the asked range broke.
    """

    name: str
    asked: str
    refined: str
    reason: str = ""

    def __str__(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"{self.name}: refined from {self.asked} to {self.refined}, as torch.export suggested{why}"


def refine(error: ExportError, spec: Any) -> tuple[Any, tuple[RefinedDim, ...]] | None:
    """``(spec with torch's suggested fixes, the dims refined)`` for a capture that failed with
    suggested fixes, or ``None``: none were suggested, one would make a dim static, or torch cannot
    apply them."""
    message = str(error.__cause__ or error)
    if "Suggested fixes:" not in message or spec is None or isinstance(spec, str):
        return None
    fixes = [m for line in message.split("Suggested fixes:", 1)[1].splitlines() if (m := _FIX.match(line))]
    if not fixes or any(m["value"].lstrip("-").isdigit() for m in fixes):
        return None  # a dim made static: the error names its guard
    try:
        fixed = "Suggested fixes:\n" + "\n".join(m.group(0).strip() for m in fixes)  # torch's text after them left out
        refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(fixed, spec)
    except Exception:  # torch could not apply them: the capture's own error stands
        return None
    given = _dims_by_name(spec)
    reasons = [line.strip(" -") for line in message.splitlines() if line.strip().startswith("- ")]
    dims = tuple(
        RefinedDim(m["name"], _spelled(given.get(m["name"]), m["name"]), m["value"], _reason(reasons, m["name"]))
        for m in fixes
    )
    return refined, dims


def _dims_by_name(spec: Any) -> dict[str, Any]:
    leaves = torch.utils._pytree.tree_leaves(spec, is_leaf=lambda x: isinstance(x, torch.export.Dim))
    return {d.__name__: d for d in leaves if isinstance(d, torch.export.Dim)}


def _spelled(dim: Any, name: str) -> str:
    if dim is None:
        return f"Dim({name!r})"
    bounds = [f"min={dim.min}" if getattr(dim, "min", 0) not in (0, 2) else "", _max(dim)]
    return f"Dim({', '.join([repr(name), *filter(None, bounds)])})"


def _max(dim: Any) -> str:
    upper = getattr(dim, "max", None)
    return f"max={upper}" if isinstance(upper, int) and upper < 2**62 else ""


def _reason(reasons: list[str], name: str) -> str:
    return next((r for r in reasons if f" {name} " in f" {r} "), "")


def report(program: Any, dims: tuple[RefinedDim, ...]) -> None:
    """Leave ``dims`` on the ``OnnxProgram`` (``refined_dims``) and in its model's metadata."""
    import json

    program.refined_dims = tuple(dims)
    if dims:
        program.model.metadata_props[REFINED_DIMS_KEY] = json.dumps([dataclasses.asdict(d) for d in dims])
