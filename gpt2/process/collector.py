"""Python's cyclic garbage collector paused while a command starts, then the heap it started with frozen.

A command's start grows the heap from nothing to ~a million objects (torch, MLflow, Prefect, the
model), and CPython runs a full collection each time the heap has grown by a quarter: about eight
full collections while a trainer starts, each walking everything imported so far, almost none of
it garbage (measured on the smoke trainer: 0.87 s of full collections before its first step). So
an entry point calls `pause()` before its heavy imports, `freeze_imports()` after them and
`started()` once it holds what it keeps (the trainer its model, optimizer and data):

- the modules' own cycles (functions, classes: ~7,000 objects after the trainer's imports) stay
  for the process's life anyway, so they are frozen as they are, not collected;
- what the start made after the imports is collected once (no tensor stays held by a cycle: on a
  GPU that memory belongs to the micro-batch), the survivors frozen too, the collector on again.

The smoke trainer's full collections: 0.87 s before, 0.29 s after (bench-free, measured with
gc.callbacks). Later full collections walk only what the run makes. Used as a library (the tests,
a notebook), nothing calls `pause()` and the other two do nothing. An explicit `gc.collect()`
(the micro-batch search's `gpt2.train.memory.release`) collects while paused as always.
"""

from __future__ import annotations

import atexit
import gc

_paused = False


def pause() -> None:
    """The collector off until `started()` (where it is on now)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def freeze_imports() -> None:
    """Where `pause()` turned the collector off: everything alive now (the imports) frozen as it is."""
    if _paused:
        gc.freeze()


def started() -> None:
    """Where `pause()` turned the collector off: collect once, freeze what is left, collector on."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.collect()
    gc.freeze()
    gc.enable()


def freeze_at_exit() -> None:
    """This process's heap frozen as it exits (after the exit handlers registered later, last in first
    out): the interpreter's final collection then does not walk and free it object by object (~1 CPU-s
    of a process that imported torch, Prefect or MLflow: python -m bench.process_start)."""
    atexit.unregister(gc.freeze)  # once, however often it is asked
    atexit.register(gc.freeze)
