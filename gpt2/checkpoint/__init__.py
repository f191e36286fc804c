"""Training checkpoints: one package for their format and their life.

    store.py    layout of a checkpoint directory, writing, verifying, finding, pruning
    writer.py   the background writer the training loop hands snapshots to
    ref.py      which checkpoint the evaluate and export stages read
"""
