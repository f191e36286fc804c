"""MkDocs hook: the configuration and CLI references, generated from the code at build time.

`reference/configuration.md` walks the typed config tree (gpt2.config): every key with its type,
default, allowed range, the identities it enters (gpt2.config.identity) and its attribute docstring, and
its value in each preset (gpt2.config.presets) where the presets differ. `reference/cli.md` is typer's own
Markdown for the `gpt2` command (cli.main). Neither page exists in the repository, so neither can
drift from the code. Named in mkdocs.yml (`hooks:`); `mkdocs build --strict` runs it.
"""

from __future__ import annotations

import ast
import enum
import sys
import types
import typing
from pathlib import Path

from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the docs build from a checkout; the project need not be installed
    sys.path.insert(0, str(REPO))

from gpt2.config import identity  # noqa: E402
from gpt2.config.presets import PRESETS  # noqa: E402
from gpt2.config.sections import EvalConfig  # noqa: E402
from gpt2.config.tree import Config  # noqa: E402

CONFIG_PAGE = "reference/configuration.md"
CLI_PAGE = "reference/cli.md"


def _type_name(annotation) -> str:
    """A field's type as a reader writes it: `int`, `float | None`, `'auto' | bool`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata) -> list[str]:
    out = []
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if getattr(m, attr, None) is not None:
                out.append(f"{sign} {getattr(m, attr)}")
        if getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return out


def _range(field) -> str:
    """Bounds from the field and from the int/float inside a union (`int ≥ 1 | 'auto'`)."""
    parts = _bounds(field.metadata)
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            for inner in typing.get_args(arg)[1:]:
                parts += _bounds(getattr(inner, "metadata", [inner]))
    return ", ".join(parts)


def _value(value, width: int = 80) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return f"`{text}`" if len(text) < width else f"`{text[:width - 3]}…`"


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        return _value(field.default)
    if field.default_factory is not None:
        return "computed (see description)"
    return "required"


def role(section: str, key: str) -> str:
    """Which fingerprints a key enters, from gpt2.config.identity's own tables."""
    data_default = identity.ADDED_DATA_KEYS.get(key)
    if section == "runtime":
        return "runtime: never in a fingerprint"
    if section == "model":
        return "identity: the run"
    if section == "data":
        if key in identity.READ_ORDER_KEYS:
            return "identity: the run (how it reads the shards), not the data's"
        if key in identity.ADDED_DATA_KEYS:
            return f"identity: the data and the run (left out at {_value(data_default)})"
        return "identity: the data and the run"
    if section == "train":
        if key in identity.NEVER_IDENTITY_KEYS:
            return "runtime: never in a fingerprint"
        if key in identity.TRAIN_RUNTIME_FIELDS:
            return "runtime: the run continues when it changes"
        if key in identity.OPTIMIZER_KEYS:
            return "identity: the run, with `train.optimizer='muon'` only"
        if key in identity.SPIKE_KEYS:
            return "identity: the run, with `train.on_spike` skip or rollback and detection on only"
        if key in identity.INIT_KEYS:
            return "identity: the run, by the weights' sha256 (left out at `scratch`)"
        return "identity: the run"
    if section == "eval":
        if key in identity.IN_LOOP_EVAL_KEYS:
            return "runtime: never in a fingerprint (what training logs as it goes)"
        if key in identity.ADDED_EVAL_KEYS:
            return f"identity: the evaluation (left out at {_value(getattr(EvalConfig(), key))})"
        return "identity: the evaluation"
    if section in ("export", "tracking"):
        return "identity: the model's registration"
    return "informational: never in a fingerprint"


def _doc(field) -> str:
    return " ".join((field.description or "").split()).replace("|", "\\|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_keys() -> list[tuple[str, str, object]]:
    """(dotted key, section, pydantic field) for every leaf of the tree, nested models included
    (a list of models as `key[].field`)."""
    out = []

    def walk(model: type[BaseModel], prefix: str, section: str):
        for name, field in model.model_fields.items():
            dotted = f"{prefix}{name}"
            inner = field.annotation
            if typing.get_origin(inner) in (tuple, list):
                inner = typing.get_args(inner)[0]
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    out.append((dotted, section or name, field))
                    walk(inner, f"{dotted}[].", section or name)
                    continue
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, f"{dotted}.", section or name)
            else:
                out.append((dotted, section or name, field))

    walk(Config, "", "")
    return out


def _preset_values(dotted: str, configs: dict[str, Config]) -> dict[str, object]:
    if "[]" in dotted:
        return {}
    values = {}
    for name, config in configs.items():
        value = config
        for part in dotted.split("."):
            value = getattr(value, part)
        values[name] = value
    return values


def configuration_page() -> str:
    configs = {name: make() for name, make in PRESETS.items()}
    lines = ["# Configuration reference", "",
             "Generated from the typed config (`gpt2/config/tree.py` and its sections) and the presets "
             "(`gpt2/config/presets.py`) when the docs are built: every key, its type, default, allowed range, "
             "the fingerprints it enters (`gpt2/config/identity.py`) and its description. *Presets* gives each "
             "preset's value where the presets differ. Set any key with `--set key=value`; see "
             "[Configuration](../configuration.md).", ""]
    section = None
    for dotted, sec, field in config_keys():
        if sec != section:
            section = sec
            lines += ["", f"## `{sec}`" if sec != "preset" else "## `preset`", "",
                      "| key | type | default | range | identity | description | presets |",
                      "|---|---|---|---|---|---|---|"]
        values = _preset_values(dotted, configs)
        shown = {_value(v) for v in values.values()}
        # A preset's value whole where it is a URL a reader copies (the fine-tune's text source).
        presets = "; ".join(f"{n}: {_value(v, 120)}" for n, v in values.items()) if len(shown) > 1 else ""
        lines.append(f"| `{dotted}` | {_cell(_type_name(field.annotation))} | {_cell(_default(field))} | "
                     f"{_cell(_range(field))} | {role(sec.split('.')[0], dotted.split('.')[-1])} | "
                     f"{_doc(field)} | {_cell(presets)} |")
    return "\n".join(lines) + "\n"


def cli_page() -> str:
    import typer
    import typer.cli
    import typer.main

    from cli.main import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    text = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="gpt2", title="CLI reference")
    intro = ("Generated from the `gpt2` command's own definitions (`cli/`) with typer's documentation "
             "output when the docs are built; `gpt2 COMMAND --help` prints the same.\n\n")
    head, _, rest = text.partition("\n\n")
    return f"{head}\n\n{intro}{rest}"


USER_ERRORS_MARK = "<!-- user-errors -->"
CODE_DIRS = ("gpt2", "tasks", "flows", "cli")


def user_errors() -> list[tuple[str, str, str]]:
    """(class, module path, docstring) of every subclass of gpt2.errors.UserError in the code,
    read from the source (nothing imported), subclasses of subclasses included."""
    classes = []
    for folder in CODE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                    classes.append((node.name, bases, path.relative_to(REPO).as_posix(),
                                    " ".join((ast.get_docstring(node) or "").split())))
    known, found = {"UserError"}, []
    while True:
        new = [c for c in classes if c[1] & known and c[0] not in known]
        if not new:
            return sorted(found, key=lambda c: (c[1], c[0]))
        known |= {c[0] for c in new}
        found += [(name, path, doc) for name, _, path, doc in new]


def user_errors_table() -> str:
    rows = ["| error | raised in | what it means |", "|---|---|---|"]
    rows += [f"| `{name}` | `{path}` | {_cell(doc)} |" for name, path, doc in user_errors()]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if USER_ERRORS_MARK in markdown:
        markdown = markdown.replace(USER_ERRORS_MARK, user_errors_table())
    return markdown


def on_files(files: Files, config) -> Files:
    for path, make in ((CONFIG_PAGE, configuration_page), (CLI_PAGE, cli_page)):
        files.append(File.generated(config, path, content=make()))
    return files
