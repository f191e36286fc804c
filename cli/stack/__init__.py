"""`gpt2 stack`: the whole architecture on this machine.

commands       the `gpt2 stack up|down|status` typer sub-app
services       start, stop and check the stack (state file, servers, workers)
prefect_setup  the Prefect side: profile, the local work pools, automations, deploy
processes      detached background processes: start, record, check, stop
"""
