"""How training processes are started: the training stage on one machine or many.

    torchrun.py     train_stage(): in this process, or under torchrun with a JSON status file
    multinode.py    runtime.nnodes > 1: torchrun's c10d rendezvous across machines
    node.py         python -m gpt2.launch.node: one pod of a multi-node Kubernetes Job
    k8s_template.py that Job's objects, rendered and checked (deployments/multinode/)
    k8s_run.py      creating the Job from the flow's pod and waiting for it
    k8s_status.py   the Job's state and its nodes' outcome records

What a training step is stays in gpt2.train, which this package imports and
which never imports it: a trainer reports to its launcher through
gpt2.train.status_file, and both read the kill window from gpt2.process.kill_window.
Submodules are imported explicitly (`from gpt2.launch.torchrun import train_stage`).
"""
