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
