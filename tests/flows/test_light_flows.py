"""A flow-run process pays for the imports its flow module makes, at every start and every
reschedule: the pipeline's parent and the data stage read no tensors, so they load neither
torch nor MLflow's client (the parent tracks through the tasks it starts; torch comes with
the stages that need it)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "mlflow", "transformers", "lm_eval")


def test_the_parent_and_the_data_flow_start_without_torch_or_mlflow(fresh_python):
    code = ("import sys, prefect.engine, flows.pipeline, flows.data\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


# A cycle whose finalizer says so when a collection frees it: only the interpreter's final collection can.
EXIT = """
import sys
{imports}
class Cycle:
    def __del__(self):
        sys.stdout.write("collected at exit\\n")
        sys.stdout.flush()

a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b
print("exiting", flush=True)
"""


def test_a_process_that_imported_the_flows_ends_without_the_final_collection(fresh_python):
    """flows/__init__.py: a flow-run process leaves its heap to the OS as it exits instead of the
    interpreter walking and freeing it (the same process without the flows shows the difference).
    The real interpreter: the warm one's children end without the interpreter's teardown."""
    outs = {}
    for imports in ("import flows", "import json"):
        done = subprocess.run([sys.executable, "-c", EXIT.format(imports=imports)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outs[imports] = done.stdout.splitlines()
    # Python's default: both halves of the cycle finalized as the interpreter ends.
    assert outs["import json"] == ["exiting", "collected at exit", "collected at exit"]
    assert outs["import flows"] == ["exiting"]
