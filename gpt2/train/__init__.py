"""The training stage: one optimizer step is read in this package alone.

    run.py          train(): process group, session, loop, SIGTERM -> Preempted
    __main__.py     python -m gpt2.train --config run.json (torchrun's entry point)
    status_file.py  the JSON-lines status file a trainer in a child process reports through
    preemption.py   SIGTERM held back until the checkpoint is written, then handed on
    session.py      what a run builds before its first step (data, model, resume)
    compile_choice.py  runtime.compile by device; eager, with one warning, where compiling fails
    loop.py         steps, validation, samples, checkpoints, metrics
    step.py         one optimizer step, a validation pass, the micro-batch search
    optim.py        AdamW groups and the learning-rate schedule
    parallel.py     DDP as built for training: gradients in its buckets, bucket size
    memory.py       memory limits, what counts as an OOM, a step's steady-state memory
    throughput.py   tokens/s and MFU
    progress.py     per-step progress records and the progress bar
    attempts.py     each training attempt's record in the run directory (gpt2.train.bill's input)
    report.py       loss curve and text samples

How training processes are started (in this process, torchrun, several
machines, a Kubernetes Job) is gpt2.launch's; the device and process group
are gpt2.process.distributed's, and the time a SIGTERM leaves is gpt2.process.kill_window's.

Submodules are imported explicitly (`from gpt2.train.run import train`): the
package itself imports nothing, so `python -m gpt2.train` starts fast.
"""
