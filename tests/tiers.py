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


# An end-to-end group is named for its module (its file's name without .py: the tests are not a
# package, so that is the module's import name, and unique) or for the stack its modules share.
# The longest groups, longest first: the fault soak on its stack (~14 min), the two groups of
# pipeline modules that share a pytest worker's stack (tests/flows/conftest.py; ~10 min each), the
# Ctrl-C scenarios (~6 min). tests/conftest.py puts them first in the collection; pytest-xdist then
# sends groups out by their number of tests, so this order decides only among groups of as many.
STACK_A, STACK_B = "stack-a", "stack-b"
E2E_FIRST = ("test_soak", STACK_A, STACK_B, "test_ctrl_c")
