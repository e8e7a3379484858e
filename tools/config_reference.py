"""The configuration reference (docs/configuration.md), generated from the pydantic models in
orchestrator/config.py so that it cannot drift from them.

    python -m tools.config_reference           # write docs/configuration.md
    python -m tools.config_reference --check   # exit 1 if the committed file differs
"""

from __future__ import annotations

import argparse
import enum
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from orchestrator.config import AppConfig

OUT = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

HEAD = """# Configuration reference

Generated from `orchestrator/config.py` by `python -m tools.config_reference`; do not edit
(`tests/unit/test_config_reference.py` fails when it differs from the models).

A Serve config file's application `args` are one `AppConfig` tree. Every model forbids unknown keys: a typo
or a bad value fails when the application is built (or in `orchestrator check-config`), naming the field's
path. Sections are listed in the order the tree reaches them; a field whose type is another section links
to it.
"""


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from `root`, depth first, each once."""
    seen: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for field in model.model_fields.values():
            for inner in _nested(field.annotation):
                visit(inner)

    visit(root)
    return seen


def _nested(annotation: typing.Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested(arg)]


def _type(annotation: typing.Any) -> str:
    """A field's type as a reader writes it in YAML terms."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type(args[0])} → {_type(args[1])}" if args else "map"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for name, symbol in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(meta, name, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "`null`"
    return f"`{value}`" if value not in ({}, []) else "empty"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section(model: type[BaseModel]) -> str:
    doc = _cell((model.__doc__ or "").strip()) if model.__doc__ and model.__module__ == AppConfig.__module__ else ""
    lines = [f"## {model.__name__}", ""]
    if doc:
        lines += [doc, ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        kind = _type(field.annotation)
        limits = _constraints(field)
        if limits:
            kind += f" ({limits})"
        lines.append(f"| `{name}` | {kind} | {_default(field)} | {_cell(field.description or '')} |")
    return "\n".join(lines)


def reference() -> str:
    return HEAD + "\n" + "\n\n".join(section(m) for m in _models(AppConfig)) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    text = reference()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            sys.exit(f"{OUT} is stale: run python -m tools.config_reference")
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
