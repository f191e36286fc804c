"""Training checkpoints: one package for their format and their life.

    store.py    what a checkpoint directory holds: encoding, writing, reading, verifying
    catalog.py  the COMPLETE marker, finding a run's complete and newest checkpoints, pruning
    writer.py   the background writer the training loop hands snapshots to (on every rank)
    shares.py   the optimizer state as one file per rank, and merging them back
    optim_share.py  this rank's share of the optimizer state (ZeRO-1 or replicated AdamW)
    ref.py      which checkpoint the evaluate and export stages read
"""
