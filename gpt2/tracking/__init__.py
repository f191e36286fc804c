"""MLflow tracking for every stage; the only package of `gpt2` that imports mlflow.

    tracker.py     the Tracker (one MLflow run fed through an outbox), and what MLflow accepts
    outbox.py      a background sender that survives outages of whatever it sends to
    store.py       the tracking URI and artifact location; SQLite stores that start seeded
    experiment.py  the experiment, made as MLflow's UI makes one, and links into the UI
"""
