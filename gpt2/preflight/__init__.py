"""`gpt2 preflight`: the checks a rented machine runs in minutes, before the
run spends on it (`python -m gpt2.preflight`, gpt2/preflight/__main__.py).

    report.py       a check's outcome, its line, the JSON
    host.py         devices, disk, lease, tracking
    storage.py      data (every shard's sha256) and the root (write, read, delete, bandwidth)
    steps.py        memory, compile, throughput: the run's own step on random tokens
    collectives.py  the roll call of every rank, and the all-reduce's bandwidth
    run.py          the order, which rank runs what, and the merge of every rank's outcome
"""
