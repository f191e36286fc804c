"""tests/tiers.py names end-to-end groups that exist."""

from pathlib import Path

from tests.tiers import E2E_FIRST, STACK_A, STACK_B

TESTS = Path(__file__).resolve().parent


def test_the_groups_sent_out_first_exist():
    """A group is named for its module's file (tests.tiers): a name that matches none sends
    nothing first, silently (as "tests.bench.soak.test_soak" did until #59)."""
    modules = {path.stem for path in TESTS.rglob("test_*.py")}
    assert set(E2E_FIRST) <= modules | {STACK_A, STACK_B}
