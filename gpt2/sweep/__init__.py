"""Sweeps: many training runs from one preset, compared in one table and one figure
(`gpt2 sweep`, flows.sweep). Pure: no Prefect, no MLflow.

    members.py   the members: `--grid key=v1,v2` (a Cartesian product) or a `--runs` file, each
                 resolved up front to a full Config and its run address
    groups.py    members grouped by their data: one data stage per distinct data config
    table.py     what the sweep ends with: a row per member, the best marked, the bill by pool
    plan.py      the sweep priced before it runs (`gpt2 plan --grid`): members x the plan, at the parallelism
"""
