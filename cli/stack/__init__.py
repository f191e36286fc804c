"""`gpt2 stack`: the whole architecture on this machine.

commands       the `gpt2 stack up|down|status` typer sub-app
services       start, stop and check the stack (state file, servers, workers)
prefect_setup  the Prefect side: profile, the local work pools, automations, deploy
processes      detached background processes: start, record, check, stop
worker         the stack's Prefect workers: Prefect's own, reporting a crash once
rescheduler    the stack's controller: crashed runs the automation missed, runs stranded in Pending
"""
