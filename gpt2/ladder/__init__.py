"""The ladder of GPU pools (runtime.gpu_pools): a choice of deployment, not a
scheduler.

    rungs.py  each rung's deployment and price; the stop of a run whose rung was left
    moves.py  when a stage's run leaves its rung, from its state history
    plan.py   what the run would take and cost on each rung (`gpt2 plan`)

flows/ladder.py acts on these decisions (cancels, starts the next rung).
"""
