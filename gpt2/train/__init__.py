"""The training stage: one optimizer step is read in this package alone.

    run.py          train(): process group, session, loop, SIGTERM -> Preempted
    __main__.py     python -m gpt2.train --config run.json (torchrun's entry point)
    launch.py       in this process, or under torchrun with a JSON status file
    multinode.py    runtime.nnodes > 1: torchrun's c10d rendezvous across machines
    node.py         python -m gpt2.train.node: one pod of a multi-node Kubernetes Job
    k8s_template.py that Job's objects, rendered and checked (deployments/multinode/)
    k8s_run.py      creating the Job from the flow's pod and waiting for it
    k8s_status.py   the Job's state and its nodes' outcome records
    session.py      what a run builds before its first step (data, model, resume)
    loop.py         steps, validation, samples, checkpoints, metrics
    step.py         one optimizer step, a validation pass, the micro-batch search
    optim.py        AdamW groups and the learning-rate schedule
    optim_share.py  this rank's share of the optimizer state, as a checkpoint stores it
    distributed.py  device and process group, from torchrun's environment
    parallel.py     DDP as built for training: gradients in its buckets, bucket size
    memory.py       memory limits, what counts as an OOM, a step's steady-state memory
    throughput.py   tokens/s and MFU
    progress.py     per-step progress records and the progress bar
    attempts.py     each training attempt's record in the run directory (gpt2.bill's input)
    report.py       loss curve and text samples

Submodules are imported explicitly (`from gpt2.train.run import train`): the
package itself imports nothing, so `python -m gpt2.train` starts fast.
"""
