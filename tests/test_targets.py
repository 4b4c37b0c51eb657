"""Targets, profiles and opset requirements."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx.defs
import pytest

import opreg
from opreg import InvalidTargetError, OpsetRequirement, Target, VersionRange
from opreg.registry.targets import DEFAULT_ONNX_OPSET, LOWEST_TARGET_OPSET, onnx_opset_range

LOW, HIGH = onnx_opset_range()


def test_supported_range_matches_installed_onnx_and_onnxscript():
    import onnxscript.onnx_opset as oo

    assert HIGH <= onnx.defs.onnx_opset_version()
    assert hasattr(oo, f"opset{HIGH}")
    assert LOW <= 18 <= DEFAULT_ONNX_OPSET <= HIGH


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"": 18}, {"": 18}),
        ({"ai.onnx": 20, "com.microsoft": 1}, {"": 20, "com.microsoft": 1}),
        (18, {"": 18}),
        ("onnx", {"": DEFAULT_ONNX_OPSET}),
        ("20", {"": 20}),
        ("ai.onnx=20,com.microsoft=1", {"": 20, "com.microsoft": 1}),
        ("onnx,com.microsoft=1", {"": DEFAULT_ONNX_OPSET, "com.microsoft": 1}),
        ("onnx, 18", {"": 18}),
    ],
)
def test_target_spellings(spec, expected):
    assert Target.of(spec).as_dict() == expected


def test_profiles_are_sugar_and_later_items_override():
    profiles = {"ort": {"": 21, "com.microsoft": 1}}
    assert Target.of("ort", profiles).as_dict() == {"": 21, "com.microsoft": 1}
    assert Target.of("ort,ai.onnx=18", profiles).as_dict() == {"": 18, "com.microsoft": 1}


def test_equality_ignores_the_display_name():
    assert Target.of("onnx") == Target.of({"": DEFAULT_ONNX_OPSET})
    assert hash(Target.of("onnx")) == hash(Target.of(DEFAULT_ONNX_OPSET))
    assert Target.of(18) != Target.of({"": 18, "com.microsoft": 1})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (HIGH + 1, f"use a version from {LOWEST_TARGET_OPSET} to {HIGH}"),
        (LOWEST_TARGET_OPSET - 1, f"use a version from {LOWEST_TARGET_OPSET} to {HIGH}"),  # 15: below 16
        (0, "at least 1"),
        (-3, "at least 1"),
        ("-3", "at least 1"),
        ("nosuchprofile", "known profiles are onnx"),
        ({"com.microsoft": 1}, "has no ai.onnx version"),
        ({"": 18, "com.microsoft": 0}, "at least 1"),
        ({"": 18, "bad domain!": 1}, "not a valid ONNX domain"),
        ("ai.onnx=x", "needs an integer version"),
        ("onnx,,", "empty item"),
        (18.0, "a target must be"),
        (True, "a target must be"),
    ],
)
def test_bad_targets_name_what_is_valid(spec, message):
    with pytest.raises(InvalidTargetError, match=message):
        Target.of(spec)


def test_requirement_checks():
    req = OpsetRequirement.build((18, 20), {"com.microsoft": 1})
    assert Target.of({"": 19, "com.microsoft": 1}).unmet(req) is None
    assert "target has 21" in Target.of({"": 21, "com.microsoft": 1}).unmet(req)
    assert "has no com.microsoft" in Target.of({"": 19}).unmet(req)
    assert "com.microsoft==2" not in (Target.of({"": 19, "com.microsoft": 2}).unmet(req) or "")


def test_version_range_validation():
    assert 18 in VersionRange(18) and 99 in VersionRange(18) and 17 not in VersionRange(18)
    assert 20 in VersionRange(18, 20) and 21 not in VersionRange(18, 20)
    with pytest.raises(InvalidTargetError, match="empty"):
        VersionRange(20, 18)
    with pytest.raises(InvalidTargetError, match="at least 1"):
        VersionRange(-1)
    with pytest.raises(InvalidTargetError, match="opset requirement must be"):
        VersionRange.of("18")
    with pytest.raises(InvalidTargetError, match="not in domains"):
        OpsetRequirement.build(18, {"ai.onnx": 18})


def test_the_newest_onnxruntime_opset_is_probed_once_per_install(tmp_path):
    """Exporting needs the onnxruntime profile's version, not onnxruntime: the probe's answer is
    cached per install, and an answer for another install is not used."""
    env = {**os.environ, "OPREG_CACHE_DIR": str(tmp_path)}
    code = "import sys, opreg; print(opreg.newest_onnxruntime_opset(), 'onnxruntime' in sys.modules)"

    def probe() -> list[str]:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return done.stdout.split()

    first = probe()
    assert first[1] == "True"  # probed: onnxruntime loaded the test models
    assert probe() == [first[0], "False"]  # from the cache, onnxruntime not even imported
    cache = tmp_path / "onnxruntime-opset.json"
    ((key, value),) = json.loads(cache.read_text()).items()
    assert value == int(first[0]) == opreg.newest_onnxruntime_opset()
    cache.write_text(json.dumps({key.replace("@", "@1", 1): 5}))  # an answer for another install time
    assert probe() == [first[0], "True"]
