"""Testing helpers for opreg and for op packs: drive impls with sample inputs,
export one-op models, run them and compare with eager PyTorch.

``opreg.testing.opinfo`` feeds ATen impls PyTorch's own OpInfo samples;
:func:`check_pack` is the conformance kit for op packs.

Importing this package is cheap (the ``opreg`` pytest plugin lives in it): the
names below, which need torch, are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from opreg.pluginapi import ModelSample, Sample, describe  # the plugin API's values live on the ground floor

if TYPE_CHECKING:
    from opreg.testing._compare import (
        Arg,
        Compare,
        Distribution,
        Exporter,
        GatherIndices,
        ScaledTolerance,
        UpcastReference,
        compare_outputs,
    )
    from opreg.testing._kit import check_pack
    from opreg.testing._kit_report import CheckResult, PackCheck
    from opreg.testing._samples import (
        DISTRIBUTION,
        FAILED,
        PASSED,
        SHAPE_ONLY,
        SKIPPED,
        STATUSES,
        TOLERANCES,
        OpCall,
        SampleCheck,
        SampleResult,
        check_samples,
    )

_LAZY = {
    "DISTRIBUTION": "_samples",
    "FAILED": "_samples",
    "PASSED": "_samples",
    "SHAPE_ONLY": "_samples",
    "SKIPPED": "_samples",
    "STATUSES": "_samples",
    "TOLERANCES": "_samples",
    "Arg": "_compare",
    "Compare": "_compare",
    "Distribution": "_compare",
    "Exporter": "_compare",
    "GatherIndices": "_compare",
    "OpCall": "_samples",
    "SampleCheck": "_samples",
    "SampleResult": "_samples",
    "ScaledTolerance": "_compare",
    "UpcastReference": "_compare",
    "check_samples": "_samples",
    "compare_outputs": "_compare",
    "CheckResult": "_kit_report",
    "PackCheck": "_kit_report",
    "check_pack": "_kit",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "DISTRIBUTION",
    "FAILED",
    "PASSED",
    "SHAPE_ONLY",
    "SKIPPED",
    "STATUSES",
    "TOLERANCES",
    "Arg",
    "CheckResult",
    "Compare",
    "Distribution",
    "Exporter",
    "GatherIndices",
    "ModelSample",
    "OpCall",
    "PackCheck",
    "Sample",
    "SampleCheck",
    "SampleResult",
    "ScaledTolerance",
    "UpcastReference",
    "check_pack",
    "check_samples",
    "compare_outputs",
    "describe",
]
