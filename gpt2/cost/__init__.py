"""What a run costs: the plan before anyone rents a GPU (`gpt2 plan`), and the
plan held against what a run measured. The bill after a run is its attempt
records' (gpt2.train.bill), which the trainer writes as it trains.

    plan.py      tokens, steps, memory, disk, time, device-hours and price of a config on a GPU
    gpus.py      the GPUs the plan knows: peaks, memory, the precision trained there
    measured.py  the newest MFU measured on the chosen GPU (bench/results.jsonl)
    actual.py    a run's plan beside what its attempt records measured (`gpt2 plan --run`)

The plan reads the trainer's own memory model and micro-batch search
(gpt2.train), so this package sits above it.
"""
