"""How processes start, stop and die: shared plumbing below every stage.

    collector.py    the garbage collector paused while a trainer or preflight starts, its start frozen
    cpu_memory.py   large CPU tensors on huge pages (set when gpt2 is imported)
    distributed.py  device and process group, from the environment torchrun sets
    kill_window.py  how long a SIGTERMed trainer has to save, and whether a save fits
    signals.py      Ctrl-C recorded; a child tied to its parent's life (torch-free)
"""
