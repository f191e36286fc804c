"""The fault soak: kill anything, lose nothing (`python -m bench.soak`, run.py).

    run.py      the soak: pipelines under seeded faults, the result, --record, --figure
    faults.py   the faults and the supervisor that plays the platform
    stack.py    the soak's own stack and its reference run
    checks.py   what each pipeline is checked for against the reference
    figure.py   the soak drawn
    results.jsonl  every recorded soak, with its seed, commit and options
"""
