"""The config: one typed, frozen tree, its presets and overrides, and the
identity each stage derives from it.

    tree.py       Config, the root of the tree, and the checks that read more than one field
    sections.py   the base of every section, and the small ones: model, eval, export, tracking
    data.py       the `data` section, and the built-in sources it can name
    train.py      the `train` section
    runtime.py    the `runtime` section: where and how fast (never identity)
    presets.py    named presets, as functions
    overrides.py  a preset plus dotted `key=value` overrides, validated at once
    identity.py   every stage's identity: what defines its result, as fingerprints

Submodules are imported explicitly (`from gpt2.config.tree import Config`).
"""
