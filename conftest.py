"""Settings for the whole suite: ``tests/`` and the packs' own tests under ``plugins/``."""

import os

# No test depends on wall-clock speed. Importing a pack is "slow" (reported by the loader, failed by
# the conformance kit) only far past what any pack takes on a loaded machine; the tests of that
# check set a threshold of their own and drive it with a pack that sleeps far past it.
os.environ["OPREG_SLOW_IMPORT_SECONDS"] = "60"

pytest_plugins = ["pytester"]  # tests/test_kit.py runs a pack author's test session in this process
