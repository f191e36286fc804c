"""gpt2.process.collector: a command's start without full collections, and nothing of the start
left held by a cycle once it is over; an import of an entry point leaves the importer's collector alone."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

# A process as `python -m gpt2.train` is one: paused before its imports, imports frozen, then the run's
# start (a cycle holding a tensor, garbage by then), then started().
START = """
import gc, json, weakref
from gpt2.process import collector
collector.pause()
paused = not gc.isenabled()
import torch
collector.freeze_imports()
frozen = gc.get_freeze_count()

class Holder:
    pass

a, b = Holder(), Holder()
a.other, b.other = b, a
a.tensor = torch.ones(1024)
gone = weakref.ref(a.tensor)
del a, b
held_while_paused = gone() is not None
collector.started()
print(json.dumps({"paused": paused, "frozen": frozen, "held_while_paused": held_while_paused,
                  "freed_by_started": gone() is None, "enabled": gc.isenabled(),
                  "frozen_after": gc.get_freeze_count()}))
"""


def test_a_paused_start_collects_its_own_garbage_once_and_freezes_the_rest():
    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["paused"] and out["frozen"] > 0
    # The cycle outlived its last reference while paused (nothing collected it), and started()'s one
    # collection freed its tensor: on a GPU that memory is the micro-batch's.
    assert out["held_while_paused"] and out["freed_by_started"]
    assert out["enabled"] and out["frozen_after"] >= out["frozen"]


def test_as_a_library_nothing_is_paused_or_frozen():
    from gpt2.process import collector

    witnesses = [[] for _ in range(1000)]  # tracked, young: a freeze would move them (and more) in
    frozen = gc.get_freeze_count()
    collector.freeze_imports()
    collector.started()
    # Not `==`: a frozen object freed meanwhile (by another test's thread) leaves the count.
    assert gc.isenabled() and gc.get_freeze_count() <= frozen, (gc.get_freeze_count(), frozen)
    assert len(witnesses) == 1000


def test_importing_the_entry_points_leaves_the_importers_collector_on():
    """Tests import `gpt2.train.__main__` and `gpt2.preflight.__main__` for their main(): only a run as a
    script pauses (a pytest worker with its collector off would keep every cycle it makes)."""
    code = "import gc, gpt2.train.__main__, gpt2.preflight.__main__\nprint(gc.isenabled())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"
