"""`python -m flows.<stage>`: run one flow from the shell without the `gpt2`
CLI (what a container entrypoint or a debugger wants); prints its result as JSON."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, Callable

from gpt2.config.overrides import ConfigError, parse_assignments


def flow_main(flow_fn: Callable[..., dict[str, Any]], doc: str, **options: Any) -> None:
    """argparse for --preset, --root, --set k=v (repeatable) and the flow's own
    `options` (name -> default; a bool default makes a flag)."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--root", default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, dest=name, action="store_true")
        else:
            parser.add_argument(flag, dest=name, default=default)
    args = vars(parser.parse_args())
    overrides, problems = parse_assignments(args.pop("sets"))
    if problems:
        raise ConfigError(problems)
    logging.basicConfig(level=logging.INFO)
    preset, root = args.pop("preset"), args.pop("root")
    if root is not None:
        overrides["runtime.root"] = root
    print(json.dumps(flow_fn(preset=preset, overrides=overrides, **args), default=str))
