"""The training stage: one optimizer step is read in this package alone.

    run.py          train(): process group, session, loop, SIGTERM -> Preempted
    __main__.py     python -m gpt2.train --config run.json (torchrun's entry point)
    launch.py       in this process, or under torchrun with a JSON status file
    session.py      what a run builds before its first step (data, model, resume)
    loop.py         steps, validation, samples, checkpoints, metrics
    step.py         one optimizer step, a validation pass, the micro-batch search
    optim.py        AdamW groups and the learning-rate schedule
    distributed.py  device and process group, from torchrun's environment
    memory.py       memory limits and what counts as an OOM
    throughput.py   tokens/s and MFU
    progress.py     per-step progress records and the progress bar
    report.py       loss curve and text samples

Submodules are imported explicitly (`from gpt2.train.run import train`): the
package itself imports nothing, so `python -m gpt2.train` starts fast.
"""
