"""GPT-2 (124M) from scratch: the pure library (never imports prefect)."""
