"""The bridge to lm-eval: our GPT as an lm-eval model (`model`) and lm-eval's own task code
run on it (`run`), for HellaSwag and for any `lm-eval:<task>` of `eval.tasks`.

The only modules of the library that import lm-eval, so the training loop's scorers stay light.
"""
