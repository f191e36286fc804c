"""Training checkpoints: one package for their format and their life.

    store.py    layout of a checkpoint directory, writing, verifying, finding, pruning
    writer.py   the background writer the training loop hands snapshots to (on every rank)
    shares.py   the optimizer state as one file per rank, and merging them back
    ref.py      which checkpoint the evaluate and export stages read
"""
