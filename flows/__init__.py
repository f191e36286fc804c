"""The pipeline's Prefect flows: the parent (pipeline.py), one module a stage, the sweep and the ladder."""

import atexit
import gc

# A process that imported the flows (a work pool's flow-run process, `python -m flows.<stage>`) ends
# as the trainer and the `gpt2` command do: its heap (Prefect, MLflow, torch for the stages that
# train, score or export) frozen, so the interpreter's final collection does not walk and free it
# object by object as it exits (0.75-1.0 CPU-s of each flow-run process: python -m bench.process_start).
# Registered first, it runs after the handlers Prefect and MLflow register later (last in, first out).
atexit.register(gc.freeze)
