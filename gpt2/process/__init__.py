"""How processes start, stop and die: shared plumbing below every stage.

    distributed.py  device and process group, from the environment torchrun sets
    kill_window.py  how long a SIGTERMed trainer has to save, and whether a save fits
    signals.py      Ctrl-C recorded; a child tied to its parent's life (torch-free)
"""
