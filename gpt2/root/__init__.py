"""The artifact root: one fsspec URL under which every output lives.

    storage.py  reading and writing it (atomic writes, checksums, any fsspec URL)
    layout.py   every path under it and in the local work dir, from a config
    checks.py   is it usable: it answers, it can be written, it is not a file

Credentials never enter what a run writes (gpt2.secrets).
"""
