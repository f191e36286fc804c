"""CORE (DCLM's in-context score, as nanochat computes it): the bundle (`bundle`), fetched once
into the root (`fetch`), its items as token rows (`prompts`), scored several per forward pass with
the one-at-a-time algorithm's decisions (`scorer`), and the per-task and CORE numbers (`score`).

Published CORE of OpenAI's GPT-2 (nanochat dev/LEADERBOARD.md): 0.1139 (124M), 0.1849 (355M),
0.2146 (774M), 0.2565 (1.5B).
"""

GPT2_CORE = {"124M": 0.1139, "355M": 0.1849, "774M": 0.2146, "1.5B": 0.2565}
"""OpenAI GPT-2's CORE by size, as nanochat's leaderboard gives it."""
