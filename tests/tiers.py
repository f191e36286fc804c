"""The tier a test runs in (pyproject's markers): a multi-process scenario
(several ranks, nodes or workers, a kill at an arbitrary point, a command's
pipeline or sweep) runs in the end-to-end tier, from the warm interpreter as the
quick tier's processes do (tests/conftest.py::warm_module), so the README's
quick command stays quick and the end-to-end tier pays each import once."""

import pytest

# A whole module: `pytestmark = SCENARIO` (or added to the module's list).
SCENARIO = [pytest.mark.e2e, pytest.mark.warm]


def scenario(test):
    """One test of a quick-tier module that is a multi-process scenario."""
    for mark in SCENARIO:
        test = mark(test)
    return test


# The end-to-end tier's longest groups (tests/conftest.py sends them out first), longest first:
# the fault soak on its stack (~9 min), the two groups of pipeline modules that share a pytest
# worker's stack (tests/flows/conftest.py; ~10 min each), the Ctrl-C scenarios (~3 min).
STACK_A, STACK_B = "stack-a", "stack-b"
E2E_FIRST = ("tests.bench.soak.test_soak", STACK_A, STACK_B, "tests.cli.test_ctrl_c")
