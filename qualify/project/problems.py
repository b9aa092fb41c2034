"""What is wrong with a project file, where, and how a message says it.

Owns the place of a problem (a ``Loc`` of keys and indices, the line and column of every key and
value of the file as read), the wording of a pydantic validation error as a problem with the
value found and a fix, and turning problems into one ``ProjectError`` of one line each. Does not
read YAML or files (``qualify.project.load``) nor decide what else is wrong beyond the model's
rules (``qualify.project.checks``).
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel
from pydantic_core import ErrorDetails
from ruamel.yaml.error import StreamMark

from qualify.errors import ProjectError
from qualify.text import one_line
from schemas.project import Budgets, Project

__all__ = [
    "Document",
    "Loc",
    "Problem",
    "class_choices",
    "fail",
    "no_such_class",
    "problem_from_error",
    "show",
]

Loc = tuple[str | int, ...]
"""A place in the document: mapping keys and list indices from the top level down."""

_SHOW_LIMIT = 60
_CLASSES_NAMED = 10
"""Classes a "no class named" message lists (a fleet has thousands)."""


def no_such_class(path: object, name: str, known: Iterable[str]) -> str:
    """What to say of a class name the project file at ``path`` does not define."""
    return f"{path}: host_classes: no class named {name!r}. Fix: {class_choices(name, known)}"


def class_choices(name: str, known: Iterable[str], whose: str = "the file's") -> str:
    """The fix for a class name not among ``known``: the closest name (if one is close), then
    the classes, the first few by name and how many (``whose``: ``the manifest's``...)."""
    names = sorted(known)
    if not names:
        return f"{whose} classes: none yet."
    close = difflib.get_close_matches(name, names, n=1)
    listed = ", ".join(names[:_CLASSES_NAMED])
    if len(names) > _CLASSES_NAMED:
        listed += f", ... ({len(names):,} classes)"
    if close:
        return f"did you mean {close[0]!r}? {whose[0].upper()}{whose[1:]} classes: {listed}."
    return f"use one of {whose} classes: {listed}."


_DUPLICATE_CLASS_KEY = re.compile(
    r"host classes '(?P<first>.+?)' and '(?P<second>.+)' have the same key"
)

# Snippets for "Fix: add ..." when a required field is missing, by (model, field).
_EXAMPLES: dict[tuple[str, str], str] = {
    ("Project", "model"): "model: my-model",
    ("Project", "artifacts"): "artifacts: {baseline: {path: models/model.onnx}}",
    (
        "Project",
        "workload",
    ): "workload: {inputs: {x: {shape: [1, 3, 224, 224], source: generated}}}",
    ("Project", "host_classes"): (
        "host_classes: {x86-avx2: {key: {hardware: x86-avx2, runtime: ort, provider: cpu}, "
        "budgets: {p99_ms: 50}}}"
    ),
    ("Artifacts", "baseline"): "baseline: {path: models/model.onnx}",
    ("ArtifactSpec", "path"): "path: models/model.onnx",
    ("Workload", "inputs"): "inputs: {x: {shape: [1, 3, 224, 224], source: generated}}",
    ("InputSpec", "shape"): "shape: [1, 3, 224, 224]",
    ("InputSpec", "source"): "source: generated",
    ("HostClass", "key"): "key: {hardware: x86-avx2, runtime: ort, provider: cpu}",
    ("HostClass", "budgets"): "budgets: {p99_ms: 50}",
    ("HostClassKey", "hardware"): "hardware: x86-avx2",
    ("HostClassKey", "runtime"): "runtime: ort",
    ("HostClassKey", "provider"): "provider: cpu",
    ("Budgets", "p99_ms"): "p99_ms: 50",
}

_UNITS = {"_ms": "milliseconds", "_mb": "megabytes", "_s": "seconds"}

_EXPECTED_TYPE: dict[str, tuple[str, str]] = {
    # pydantic error type -> (what was expected, an example of it)
    "int_type": ("an integer", "2"),
    "int_parsing": ("an integer", "2"),
    "int_from_float": ("a whole number", "2"),
    "float_type": ("a number", "1.5"),
    "float_parsing": ("a number", "1.5"),
    "string_type": ("a string", "'text'"),
    "bool_type": ("true or false", "true"),
    "bool_parsing": ("true or false", "true"),
    "list_type": ("a list", "[1, 2]"),
    "dict_type": ("a mapping", "{name: value}"),
    "model_type": ("a mapping", "{name: value}"),
    "model_attributes_type": ("a mapping", "{name: value}"),
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the file, at one place."""

    loc: Loc
    """The field it is about; empty for the file as a whole."""
    message: str
    """What is wrong, with what was found."""
    fix: str | None = None
    """What to do about it, when there is one thing to do."""
    mark: StreamMark | None = None
    """Where in the file it is (line and column), when known."""


@dataclass
class Document:
    """Plain data built from the YAML node tree, with where each key and value starts."""

    data: object = None
    """The document as plain dicts, lists and scalars."""
    key_marks: dict[Loc, StreamMark] = field(default_factory=dict)
    """Where each mapping key starts."""
    value_marks: dict[Loc, StreamMark] = field(default_factory=dict)
    """Where each value starts."""
    raw: dict[Loc, str] = field(default_factory=dict)
    """Each scalar as written, before YAML typed it (for "quote it" fixes)."""
    problems: list[Problem] = field(default_factory=list)
    """What was found wrong while building it (duplicate keys, alias loops, odd keys)."""

    def render_loc(self, loc: Loc) -> str:
        """``host_classes.arm-r5.budgets.p99_ms`` / ``artifacts.candidates[0].path``."""
        out = ""
        node: object = self.data
        for part in loc:
            if isinstance(node, list) and isinstance(part, int):
                out += f"[{part}]"
                node = node[part] if 0 <= part < len(node) else None
                continue
            text = str(part)
            if not text or not text.isprintable() or any(c in text for c in ".[]: "):
                text = repr(text)  # quoted, with a newline or escape spelled out
            out += f".{text}" if out else text
            node = node.get(part) if isinstance(node, dict) else None
        return out

    def mark_for(self, loc: Loc, *, on_key: bool = False) -> StreamMark | None:
        """Where ``loc`` starts (its key if ``on_key``), else its nearest ancestor's value."""
        if on_key and loc in self.key_marks:
            return self.key_marks[loc]
        for end in range(len(loc), -1, -1):
            mark = self.value_marks.get(loc[:end])
            if mark is not None:
                return mark
        return None


def _where(display: str, mark: StreamMark | None) -> str:
    if mark is None:
        return display
    return f"{display}:{mark.line + 1}:{mark.column + 1}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def _format(display: str, doc: Document | None, problem: Problem) -> str:
    where = _where(display, problem.mark)
    what = _sentence(problem.message)
    if problem.loc:
        name = doc.render_loc(problem.loc) if doc is not None else ".".join(map(str, problem.loc))
        line = f"{where}: {name}: {what}"
    else:
        line = f"{where}: {what}"
    if problem.fix:
        line += f" Fix: {_sentence(problem.fix)}"
    return one_line(line)  # one problem, one line, whatever the file holds


def fail(display: str, doc: Document | None, problems: list[Problem]) -> ProjectError:
    """The error to raise for ``problems``: one line each, ``file:line:column: field: what.
    Fix: ...``, under a count when there are several.

    Args:
        display: How to name the file, e.g. its path as given.
        doc: The document the problems are in, to spell their fields as written (None before
            there is one: the fields are then joined with dots).
        problems: What is wrong, in the order to report it.
    """
    lines = [_format(display, doc, p) for p in problems]
    if len(lines) > 1:
        lines.insert(0, f"{display}: {len(lines)} problems:")
    return ProjectError("\n".join(lines))


def show(value: object) -> str:
    """A found value, the way a person reading the YAML would recognise it."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 4] + "...'"
    if isinstance(value, dict):
        keys = ", ".join(str(k) for k in value)
        return f"a mapping with keys {keys}" if value else "an empty mapping"
    if isinstance(value, list):
        text = repr(value)
        return f"a list {text}" if len(text) <= _SHOW_LIMIT else f"a list of {len(value)} items"
    return f"{type(value).__name__} {value!s}"


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _unwrap(tp: object) -> object:
    """``X | None`` -> ``X``; anything else unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _type_at(loc: Loc) -> object:
    """The declared type of the field at ``loc`` in the Project model, or None if unknown."""
    tp: object = Project
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            info = tp.model_fields.get(str(part))
            if info is None:
                return None
            tp = info.annotation
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        elif origin is list:
            tp = typing.get_args(tp)[0]
        else:
            return None
    return _unwrap(tp)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    tp = _type_at(loc)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _split_loc(raw: tuple[str | int, ...], data: object) -> tuple[Loc, bool]:
    """Map a pydantic error location onto the document: (loc, whether it names a mapping key).

    Pydantic adds ``'[key]'`` for an invalid mapping key and may add tags for union branches;
    those are dropped so the location matches the YAML.
    """
    loc: list[str | int] = []
    node: object = data
    on_key = False
    for i, part in enumerate(raw):
        if part == "[key]":
            on_key = True
            break
        in_mapping = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_mapping or in_list:
            node = node[part]  # type: ignore[index]
        elif i == len(raw) - 1:
            node = None  # a missing or unknown field: the last part is the field's name
        else:
            continue  # a union-branch tag, not a place in the document
        loc.append(part)
    return tuple(loc), on_key


_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _out_of_bounds(
    kind: str, ctx: Mapping[str, object], found: object, name: str, parent: type[BaseModel] | None
) -> tuple[str, str]:
    bound_key, phrase = _BOUNDS[kind]
    bound = _number(ctx.get(bound_key))
    message = f"must be {phrase} {bound}, found {show(found)}"
    if parent is Budgets and name == "memory_limit_mb" and bound_key == "le":
        return message, f"set the address space the class's hosts can give ({_host_memory()})"
    if parent is Budgets and bound_key == "gt" and bound == "0":
        unit = next((u for s, u in _UNITS.items() if name.endswith(s)), None)
        return message, f"set a positive budget in {unit}" if unit else "set a positive budget"
    return message, f"set a number {phrase} {bound}"


def _host_memory() -> str:
    """This host's memory, as a message says it: what a memory limit should be measured by."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return "this host's memory is unknown"
    return f"this host has {pages * size // 2**20} MB"


def _too_short(
    loc: Loc, name: str, ctx: Mapping[str, object], found: object, mark: StreamMark | None
) -> Problem:
    least = ctx.get("min_length", 1)
    if isinstance(found, str):
        message = f"must not be empty, found {show(found)}"
    else:
        noun = "item" if least == 1 else "items"
        message = f"must have at least {least} {noun}, found {show(found)}"
    fix = (
        "define at least one host class (run 'qualify demo --workdir DIR' for an example)"
        if loc == ("host_classes",)
        else f"give {name or 'it'} a value"
    )
    return Problem(loc, message, fix, mark)


def _missing(loc: Loc, name: str, parent: type[BaseModel] | None, doc: Document) -> Problem:
    example = _EXAMPLES.get((parent.__name__, name)) if parent is not None else None
    where = doc.render_loc(loc[:-1]) or "the top level"
    if example is None:
        info = parent.model_fields.get(name) if parent is not None else None
        hint = f" ({info.description.rstrip('.')})" if info is not None and info.description else ""
        fix = f"add '{name}:' under {where}{hint}"
    else:
        fix = f"add '{example}' under {where}"
    return Problem(loc, "required field is missing", fix, doc.mark_for(loc[:-1]))


def _duplicate_class_key(
    error: ErrorDetails, ctx: Mapping[str, object], doc: Document
) -> Problem | None:
    """Project's validator names the two classes in its message (or, as a custom error type,
    in ctx); point at the second class's key rather than at the whole file."""
    match = _DUPLICATE_CLASS_KEY.search(error["msg"])
    names = (ctx.get("first"), ctx.get("second")) if match is None else match.group(1, 2)
    if not (all(isinstance(n, str) for n in names) and isinstance(doc.data, dict)):
        return None
    first, second = str(names[0]), str(names[1])
    class_loc: Loc = ("host_classes", second, "key")
    first_mark = doc.mark_for(("host_classes", first), on_key=True)
    at = f" (line {first_mark.line + 1})" if first_mark is not None else ""
    classes = doc.data.get("host_classes")
    key = classes.get(second, {}).get("key") if isinstance(classes, dict) else None
    key_text = (
        f"[{key.get('hardware')}, {key.get('runtime')}, {key.get('provider')}]"
        if isinstance(key, dict)
        else "key"
    )
    return Problem(
        class_loc,
        f"same key {key_text} as host class {first!r}{at}; "
        "every class needs its own (hardware, runtime, provider)",
        f"change hardware, runtime or provider of {second!r} or {first!r}, or remove one",
        doc.mark_for(class_loc),
    )


def problem_from_error(error: ErrorDetails, doc: Document) -> Problem:
    """One pydantic validation error, placed in ``doc`` and worded for the person who wrote the
    file: what was expected, what was found and a fix (a close key's name, an example snippet,
    quotes for a value YAML read as something else)."""
    kind = error["type"]
    ctx: Mapping[str, object] = error.get("ctx") or {}
    found = error.get("input")
    loc, on_key = _split_loc(tuple(error["loc"]), doc.data)
    name = str(loc[-1]) if loc else ""
    parent = _model_at(loc[:-1]) if loc else None

    if kind == "missing":
        return _missing(loc, name, parent, doc)

    if kind == "extra_forbidden":
        allowed = sorted(parent.model_fields) if parent is not None else []
        message = f"unknown key {name!r}. Expected one of: {', '.join(allowed)}"
        close = difflib.get_close_matches(name, allowed, n=1)
        fix = f"rename it to {close[0]!r}" if close else "remove it or correct its spelling"
        return Problem(loc, message, fix, doc.mark_for(loc, on_key=True))

    mark = doc.mark_for(loc, on_key=on_key)
    subject = "the key must be" if on_key else "must be"

    if kind in ("value_error", "duplicate_host_class_key") and not loc:
        duplicate = _duplicate_class_key(error, ctx, doc)
        if duplicate is not None:
            return duplicate

    if kind in ("value_error", "assertion_error"):
        message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return Problem(loc, message, None, mark)

    if kind in _BOUNDS:
        message, fix = _out_of_bounds(kind, ctx, found, name, parent)
        return Problem(loc, message, fix, mark)

    if kind in ("too_short", "string_too_short"):
        return _too_short(loc, name, ctx, found, mark)

    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        message = f"{subject} one of {expected}, found {show(found)}"
        return Problem(loc, message, f"use one of {expected}", mark)

    if kind in _EXPECTED_TYPE:
        expected, example = _EXPECTED_TYPE[kind]
        raw = doc.raw.get(loc)
        label = f"{name}: " if loc and isinstance(loc[-1], str) else ""
        if kind == "string_type" and raw is not None and found is not None:
            # YAML read 1.31, yes or 2024-01-01 as something other than text.
            fix = f'quote it: {label}"{raw}"'
        elif found is None:
            fix = f"give it a value, e.g. {label}{example}"
        else:
            fix = f"write {expected}, e.g. {label}{example}"
        message = f"{subject} {expected}, found {show(found)}"
        return Problem(loc, message, fix, mark)

    message = error["msg"]
    return Problem(loc, f"{message[:1].lower()}{message[1:]}, found {show(found)}", None, mark)
