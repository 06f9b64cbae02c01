"""A config document: read a file, validate it against a pydantic model, say what is wrong.

Every error is a ``ConfigError`` whose message names the file, the key path
(``children[0].members``) and what is expected, so that a service can print it
as one line and ``qm`` next to the flag that named the file.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or setting is unreadable or invalid; the message says where and why."""


class FileModel(BaseModel):
    """A mapping in a config file: unknown keys are errors (a typo is not a default), values
    are taken as written (no ``"12"`` for 12, no ``true`` for 1) and numbers are finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def read_document(path: Path) -> object:
    """The parsed content of a YAML file (or JSON, by its suffix); ``None`` when empty."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
        raise ConfigError(f"{path}: cannot read: {reason}") from exc
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"{path}: {where}not valid YAML: {problem}") from exc


def load(model: type[M], path: Path) -> M:
    """Read ``path`` and validate it as ``model``."""
    return validate(model, read_document(path), str(path))


def validate(model: type[M], raw: object, source: str) -> M:
    """``raw`` as ``model``, or a ``ConfigError`` naming ``source`` and every bad key."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = [_problem(model, error) for error in exc.errors(include_url=False)]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def key_path(loc: Sequence[int | str]) -> str:
    """``("children", 0, "members")`` -> ``children[0].members``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_EXPECTED = {
    "missing": "required",
    "dict_type": "expected a mapping",
    "mapping_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "greater_than": "expected a number > {gt}",
    "greater_than_equal": "expected a number >= {ge}",
    "less_than": "expected a number < {lt}",
    "less_than_equal": "expected a number <= {le}",
    "literal_error": "expected one of {expected}",
    "enum": "expected one of {expected}",
    "string_too_short": "expected at least {min_length} character(s)",
    "string_too_long": "expected at most {max_length} characters",
    "string_pattern_mismatch": "expected text matching {pattern}",
    "too_short": "expected at least {min_length} item(s)",
    "too_long": "expected at most {max_length} items",
}


def _problem(model: type[BaseModel], error: ErrorDetails) -> str:
    loc = [part for part in error["loc"] if part != "[key]"]
    where = key_path(loc) + (" (a key)" if "[key]" in error["loc"] else "")
    kind = error["type"]
    ctx = {k: f"{v:g}" if isinstance(v, float) else v for k, v in error.get("ctx", {}).items()}
    if kind == "extra_forbidden":
        known = _keys_at(model, loc[:-1])
        what = "unknown key" + (f"; known keys: {', '.join(known)}" if known else "")
    elif kind == "value_error":
        what = str(ctx.get("error", error["msg"]))
    elif kind in _EXPECTED:
        what = _EXPECTED[kind].format(**ctx)
    else:
        what = error["msg"]
    if kind not in ("missing", "extra_forbidden", "value_error"):
        what += f", got {_shown(error['input'])}"
    return f"{where}: {what}" if where else what


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys the mapping at ``loc`` may hold, found by walking the model's annotations."""
    node: Any = model
    for part in loc:
        node = _inner(node, part)
    node = _inner(node, None)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return [field.alias or name for name, field in node.model_fields.items()]
    return []


def _inner(annotation: Any, part: int | str | None) -> Any:
    """One step into ``annotation`` along ``part`` (``None``: just unwrap it)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            models = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = models[0] if len(models) == 1 else None
        else:
            break
    if part is None:
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = annotation.model_fields.items()
        return next((f.annotation for name, f in fields if part in (name, f.alias)), None)
    args = typing.get_args(annotation)
    if isinstance(typing.get_origin(annotation), type) and issubclass(
        typing.get_origin(annotation), Mapping
    ):
        return args[1] if len(args) == 2 else None
    return args[0] if args else None
