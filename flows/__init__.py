"""The pipeline's Prefect flows: the parent (pipeline.py), one module a stage, the sweep and the ladder."""

from gpt2.process import collector

# A process that imported the flows (a work pool's flow-run process, `python -m flows.<stage>`) ends
# as the trainer and the `gpt2` command do: its heap (Prefect, MLflow, torch for the stages that
# train, score or export) left to the OS. Registered as the flows are imported, it runs after the
# exit handlers Prefect and MLflow register later.
collector.freeze_at_exit()
