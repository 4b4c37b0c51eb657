"""opreg-diffusers checked by the conformance kit: it loads, imports cheaply, and its one hook
returns what the hookspec says (its loader's exports are tests/test_checkpoint_diffusers.py's)."""

from __future__ import annotations


def test_conformance(opreg_pack_check):
    opreg_pack_check("diffusers").assert_ok()
