"""Evaluation of a checkpoint: one package per benchmark (HellaSwag today), so
the next benchmark has an obvious home.

Kept empty of imports: the training loop imports `gpt2.eval.hellaswag` alone,
without lm-eval or any other benchmark's code.
"""
