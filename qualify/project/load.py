"""Loading and writing the project file (``qualify.yaml``).

Owns reading the YAML while keeping the line and column of every key and value, validating the
data against ``schemas.project.Project``, the checks a model cannot make (duplicate YAML keys,
files that must exist beside the project file), and turning every failure into one
``ProjectError`` whose message names the file, the line, the field, what was expected, what was
found and how to fix it. Also owns writing a project back as readable YAML, atomically.

Does not own the models or their rules (``schemas.project``), loading artifacts or input arrays
(shapes and dtypes are checked by the run), nor printing the error (``qualify.cli``).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import os
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, StreamMark, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from qualify.errors import ArtifactError, ProjectError
from qualify.project.graph import ModelSignature, TensorSignature, read_signature
from qualify.project.view import MAX_PROJECT_BYTES
from qualify.text import one_line
from schemas.atomic import kind_of, open_binary, read_bounded, write_atomic
from schemas.project import ArtifactSpec, Budgets, InputSpec, Project, Workload

__all__ = [
    "PROJECT_FILENAME",
    "LoadedProject",
    "dump_project",
    "hook_problem",
    "hook_source",
    "load_project",
    "load_project_text",
    "parse_project",
    "write_project",
]

PROJECT_FILENAME = "qualify.yaml"
"""The project file's default name."""

Loc = tuple[str | int, ...]
"""A place in the document: mapping keys and list indices from the top level down."""

_NPY_MAGIC = b"\x93NUMPY"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SHOW_LIMIT = 60
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
class LoadedProject:
    """A validated project file and the folder its relative paths are resolved against."""

    path: Path
    """The project file, absolute."""
    root: Path
    """The folder of the project file, absolute."""
    project: Project
    """The validated project."""
    sha256: str | None = None
    """Hex sha256 of the exact bytes validated (None for a project built in code): the key a
    writer records the project's view under (`qualify.project.view`)."""

    def resolve(self, relpath: str | os.PathLike[str]) -> Path:
        """Resolve a path written in the project file.

        Args:
            relpath: A path as written in the file; relative paths are relative to the folder of
                the project file (never the current directory), absolute paths are kept.

        Returns:
            An absolute path (symbolic links are not resolved).
        """
        candidate = Path(relpath)
        return candidate if candidate.is_absolute() else self.root / candidate


@dataclass(frozen=True)
class _Problem:
    """One thing wrong with the file, at one place."""

    loc: Loc
    message: str
    fix: str | None = None
    mark: StreamMark | None = None


@dataclass
class _Document:
    """Plain data built from the YAML node tree, with where each key and value starts."""

    data: object = None
    key_marks: dict[Loc, StreamMark] = field(default_factory=dict)
    value_marks: dict[Loc, StreamMark] = field(default_factory=dict)
    raw: dict[Loc, str] = field(default_factory=dict)
    problems: list[_Problem] = field(default_factory=list)

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


class _Builder:
    """Turns a composed YAML node tree into plain data, recording marks and refusing duplicates."""

    def __init__(self, constructor: SafeConstructor, display: str) -> None:
        self._constructor = constructor
        self.display = display
        self.count = 0
        self.doc = _Document()

    def build(self, node: Node) -> _Document:
        self.doc.data = self._node(node, (), frozenset())
        return self.doc

    def _node(self, node: Node, loc: Loc, active: frozenset[int]) -> object:
        self.count += 1
        if self.count > MAX_NODES or len(loc) > MAX_DEPTH:
            what = (
                f"more than {MAX_NODES:,} values once its aliases are expanded"
                if self.count > MAX_NODES
                else f"nested more than {MAX_DEPTH} levels deep"
            )
            raise _fail(
                self.display,
                None,
                [
                    _Problem(
                        (),
                        f"the file holds {what}",
                        "write the settings out plainly",
                        node.start_mark,
                    )
                ],
            )
        self.doc.value_marks[loc] = node.start_mark
        if id(node) in active:
            self.doc.problems.append(
                _Problem(
                    loc,
                    "an alias refers to a node that contains it",
                    "remove the alias loop",
                    node.start_mark,
                )
            )
            return None
        if isinstance(node, MappingNode):
            return self._mapping(node, loc, active | {id(node)})
        if isinstance(node, SequenceNode):
            inner = active | {id(node)}
            return [self._node(item, (*loc, i), inner) for i, item in enumerate(node.value)]
        if isinstance(node, ScalarNode):
            self.doc.raw[loc] = node.value
        return self._constructor.construct_object(node, deep=True)

    def _key(self, node: Node, loc: Loc) -> str | None:
        # Every mapping key in a project file is a name, so keys are taken as written:
        # a class called `on` or an output called `1.0` stays a string (YAML 1.1 would make
        # them a boolean and a float).
        if isinstance(node, ScalarNode):
            return str(node.value)
        self.doc.problems.append(
            _Problem(
                loc,
                "a key must be a plain name",
                "write the key as a name, e.g. 'name:'",
                node.start_mark,
            )
        )
        return None

    def _mapping(self, node: MappingNode, loc: Loc, active: frozenset[int]) -> object:
        # Duplicates are judged on the keys written here; keys merged in with '<<' may be
        # overridden, which is what merge keys are for.
        first_seen: dict[str, StreamMark] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = str(key_node.value)
            earlier = first_seen.get(key)
            if earlier is not None:
                self.doc.problems.append(
                    _Problem(
                        (*loc, key),
                        f"duplicate key {key!r} (first at line {earlier.line + 1}); "
                        "YAML would silently keep only the last one",
                        "merge the two entries into one or remove one of them",
                        key_node.start_mark,
                    )
                )
            else:
                first_seen[key] = key_node.start_mark
        self._constructor.flatten_mapping(node)
        out: dict[str, object] = {}
        for key_node, value_node in node.value:
            name = self._key(key_node, loc)
            if name is None:
                continue
            child = (*loc, name)
            self.doc.key_marks[child] = key_node.start_mark
            out[name] = self._node(value_node, child, active)
        return out


def _where(display: str, mark: StreamMark | None) -> str:
    if mark is None:
        return display
    return f"{display}:{mark.line + 1}:{mark.column + 1}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def _format(display: str, doc: _Document | None, problem: _Problem) -> str:
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


def _fail(display: str, doc: _Document | None, problems: list[_Problem]) -> ProjectError:
    lines = [_format(display, doc, p) for p in problems]
    if len(lines) > 1:
        lines.insert(0, f"{display}: {len(lines)} problems:")
    return ProjectError("\n".join(lines))


def _show(value: object) -> str:
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
    message = f"must be {phrase} {bound}, found {_show(found)}"
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
) -> _Problem:
    least = ctx.get("min_length", 1)
    if isinstance(found, str):
        message = f"must not be empty, found {_show(found)}"
    else:
        noun = "item" if least == 1 else "items"
        message = f"must have at least {least} {noun}, found {_show(found)}"
    fix = (
        "define at least one host class (run 'qualify demo --workdir DIR' for an example)"
        if loc == ("host_classes",)
        else f"give {name or 'it'} a value"
    )
    return _Problem(loc, message, fix, mark)


def _missing(loc: Loc, name: str, parent: type[BaseModel] | None, doc: _Document) -> _Problem:
    example = _EXAMPLES.get((parent.__name__, name)) if parent is not None else None
    where = doc.render_loc(loc[:-1]) or "the top level"
    if example is None:
        info = parent.model_fields.get(name) if parent is not None else None
        hint = f" ({info.description.rstrip('.')})" if info is not None and info.description else ""
        fix = f"add '{name}:' under {where}{hint}"
    else:
        fix = f"add '{example}' under {where}"
    return _Problem(loc, "required field is missing", fix, doc.mark_for(loc[:-1]))


def _duplicate_class_key(
    error: ErrorDetails, ctx: Mapping[str, object], doc: _Document
) -> _Problem | None:
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
    return _Problem(
        class_loc,
        f"same key {key_text} as host class {first!r}{at}; "
        "every class needs its own (hardware, runtime, provider)",
        f"change hardware, runtime or provider of {second!r} or {first!r}, or remove one",
        doc.mark_for(class_loc),
    )


def _problem_from_error(error: ErrorDetails, doc: _Document) -> _Problem:
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
        return _Problem(loc, message, fix, doc.mark_for(loc, on_key=True))

    mark = doc.mark_for(loc, on_key=on_key)
    subject = "the key must be" if on_key else "must be"

    if kind in ("value_error", "duplicate_host_class_key") and not loc:
        duplicate = _duplicate_class_key(error, ctx, doc)
        if duplicate is not None:
            return duplicate

    if kind in ("value_error", "assertion_error"):
        message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return _Problem(loc, message, None, mark)

    if kind in _BOUNDS:
        message, fix = _out_of_bounds(kind, ctx, found, name, parent)
        return _Problem(loc, message, fix, mark)

    if kind in ("too_short", "string_too_short"):
        return _too_short(loc, name, ctx, found, mark)

    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        message = f"{subject} one of {expected}, found {_show(found)}"
        return _Problem(loc, message, f"use one of {expected}", mark)

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
        message = f"{subject} {expected}, found {_show(found)}"
        return _Problem(loc, message, fix, mark)

    message = error["msg"]
    return _Problem(loc, f"{message[:1].lower()}{message[1:]}, found {_show(found)}", None, mark)


def _reader() -> YAML:
    # ruamel's pure-Python safe loader: plain values only (a tag that would build an object is
    # refused) and a mark for every node. YAML 1.2, as the round-trip edits (`edit.py`) read it:
    # `yes`, `on` and `off` are text, not booleans.
    return YAML(typ="safe", pure=True)


def _compose(text: str, display: str) -> _Document:
    reader = _reader()
    try:
        node = reader.compose(text)
        if node is None:
            raise _fail(
                display,
                None,
                [
                    _Problem(
                        (),
                        "the file is empty",
                        "run 'qualify demo --workdir DIR' to write an example project file",
                    )
                ],
            )
        doc = _Builder(reader.constructor, display).build(node)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        source = ""
        if mark is not None:
            lines = text.splitlines()
            if 0 <= mark.line < len(lines):
                source = f" (line {mark.line + 1}: {lines[mark.line].strip()!r})"
        if "'\\t'" in what:
            fix = "indent with spaces, not tabs"
        elif "constructor for the tag" in what:
            fix = "remove the '!' tag; a project file holds plain values only"
        else:
            fix = "check the indentation and quoting there; a value with ': ' or ' #' needs quotes"
        raise _fail(
            display, None, [_Problem((), f"not valid YAML: {what}{source}", fix, mark)]
        ) from exc
    except YAMLError as exc:
        raise _fail(display, None, [_Problem((), f"not valid YAML: {exc}", None)]) from exc
    except RecursionError:
        raise _fail(
            display,
            None,
            [
                _Problem(
                    (),
                    f"nested more than {MAX_DEPTH} levels deep",
                    "write the settings out plainly",
                )
            ],
        ) from None
    return doc


def _validate(doc: _Document, display: str) -> Project:
    if not isinstance(doc.data, dict):
        allowed = ", ".join(Project.model_fields)
        raise _fail(
            display,
            doc,
            [
                _Problem(
                    (),
                    f"the top level must be a mapping with keys {allowed}; found {_show(doc.data)}",
                    "run 'qualify demo --workdir DIR' to see an example project file",
                    doc.value_marks.get(()),
                )
            ],
        )
    problems = list(doc.problems)
    try:
        project = Project.model_validate(doc.data)
    except ValidationError as exc:
        problems += [_problem_from_error(e, doc) for e in exc.errors(include_url=False)]
        cause: Exception | None = exc
    else:
        cause = None
    if problems:
        problems.sort(key=lambda p: (p.mark.line, p.mark.column) if p.mark else (-1, -1))
        raise _fail(display, doc, problems) from cause
    return project


def parse_project(text: str, *, source: str = PROJECT_FILENAME) -> Project:
    """Parse and validate project YAML without touching the file system.

    Args:
        text: The YAML text.
        source: How to name the text in messages, e.g. the file's path.

    Returns:
        The validated project.

    Raises:
        ProjectError: the text is not YAML, has duplicate keys or does not validate; the message
            has one line per problem with line, column, field, what was found and a fix.
    """
    return _validate(_compose(text, source), source)


def _check_file(
    loaded: LoadedProject, doc: _Document, loc: Loc, relpath: str, *, npy: bool
) -> _Problem | None:
    target = loaded.resolve(relpath)
    mark = doc.mark_for(loc)
    relative = f"; relative paths are resolved against {loaded.root}"
    if not target.exists():
        return _Problem(loc, f"file not found: {target}", f"correct the path{relative}", mark)
    if not target.is_file():
        kind = kind_of(target.stat().st_mode)
        return _Problem(loc, f"not a file: {target} is {kind}", "point it at a regular file", mark)
    try:
        with open_binary(target) as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError as exc:
        return _Problem(
            loc, f"cannot read {target}: {exc.strerror or exc}", "fix its permissions", mark
        )
    if npy and head != _NPY_MAGIC:
        return _Problem(
            loc,
            f"not a .npy file: {target} does not start with the NumPy magic bytes",
            "save the samples with numpy.save(path, array)",
            mark,
        )
    return None


MAX_NODES = 100_000
"""Most values a project file may hold once its aliases are expanded (a 'billion laughs' of
nested aliases is refused here, not expanded)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a project file may have."""


def _read_bounded_text(path: Path, display: str) -> str:
    """The file's UTF-8 text, read only if it is a regular file no larger than the limit (a
    device such as ``/dev/zero`` or a pipe is refused without reading it)."""
    data = read_bounded(path, MAX_PROJECT_BYTES)
    if len(data) > MAX_PROJECT_BYTES:
        raise ProjectError(
            f"{display}: larger than {MAX_PROJECT_BYTES // 1024} KiB; a project file is a few "
            "kilobytes of settings. Fix: pass the project file, not data."
        )
    return data.decode("utf-8")


def load_project(path: Path, *, check_models: bool = True) -> LoadedProject:
    """Read, validate and check a project file.

    Args:
        path: The project file. Paths inside it are resolved against its folder.
        check_models: Also parse every artifact's graph and check the workload and tolerances
            against it (this reads each model file whole). Commands that only read the matrix
            (``matrix show``, ``matrix stale``, ``report``) pass False.

    Returns:
        The validated project with its absolute path and folder.

    Raises:
        ProjectError: the file is missing or unreadable, is not valid YAML, has duplicate keys,
            does not validate, or names an artifact or recorded input file that does not exist
            or cannot be read. Every problem found is reported, one line each, with the file,
            line, column, field path, what was found and a fix.
    """
    display = str(path)
    absolute = Path(os.path.abspath(path))
    try:
        text = _read_bounded_text(absolute, display)
    except FileNotFoundError:
        raise ProjectError(
            f"{display}: project file not found. Fix: pass the path of an existing project file, "
            f"or run 'qualify demo --workdir DIR' to write an example {PROJECT_FILENAME}."
        ) from None
    except IsADirectoryError:
        raise ProjectError(
            f"{display}: is a folder, not a project file. Fix: pass the file itself, e.g. "
            f"{Path(display) / PROJECT_FILENAME}."
        ) from None
    except UnicodeDecodeError as exc:
        raise ProjectError(
            f"{display}: not UTF-8 text (byte {exc.start}). Fix: save the file as UTF-8."
        ) from None
    except OSError as exc:
        raise ProjectError(
            f"{display}: cannot read the project file: {exc.strerror or exc}. "
            "Fix: check the path and its permissions."
        ) from None

    return load_project_text(text, path, check_models=check_models)


def load_project_text(text: str, path: Path, *, check_models: bool = True) -> LoadedProject:
    """Validate and check ``text`` as the project file at ``path`` would be, without reading
    or writing that file: what a writer checks before it replaces a project file (``qualify
    init``), so that a file that would not load never reaches the disk.

    Raises:
        ProjectError: as `load_project`, the messages naming ``path``.
    """
    display = str(path)
    absolute = Path(os.path.abspath(path))
    doc = _compose(text, display)
    project = _validate(doc, display)
    # Strict UTF-8 decoding round-trips: these are the bytes read.
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    loaded = LoadedProject(path=absolute, root=absolute.parent, project=project, sha256=digest)

    checks: list[tuple[Loc, str, bool]] = [
        (("artifacts", "baseline", "path"), project.artifacts.baseline.path, False)
    ]
    checks += [
        (("artifacts", "candidates", i, "path"), spec.path, False)
        for i, spec in enumerate(project.artifacts.candidates)
    ]
    checks += [
        (("workload", "inputs", name, "file"), spec.file, spec.file.endswith(".npy"))
        for name, spec in project.workload.inputs.items()
        if spec.source == "recorded" and spec.file is not None
    ]
    problems = [
        problem
        for loc, relpath, npy in checks
        if (problem := _check_file(loaded, doc, loc, relpath, npy=npy)) is not None
    ]
    problems += _check_lineage(project, doc)
    problems += _check_hooks(loaded, doc)
    if problems:
        raise _fail(display, doc, problems)
    problems = _check_models(loaded, doc) if check_models else []
    if problems:
        raise _fail(display, doc, problems)
    return loaded


MAX_HOOK_SOURCE_BYTES = 4 * 1024 * 1024
"""The largest hook module source the load check parses."""


def _check_hooks(loaded: LoadedProject, doc: _Document) -> list[_Problem]:
    """Every ``workload.pipeline`` hook names a module that exists (beside the project file, or
    installed) and a function it defines. Checked without running the user's code: the module's
    source is parsed, never imported, in this process."""
    pipeline = loaded.project.workload.pipeline
    found: list[_Problem] = []
    for stage in ("pre", "post"):
        hook = getattr(pipeline, stage) if pipeline is not None else None
        if hook is None:
            continue
        loc: Loc = ("workload", "pipeline", stage)
        why = hook_problem(loaded.root, hook)
        if why is not None:
            message, fix = why
            found.append(_Problem(loc, message, fix, doc.mark_for(loc)))
    return found


def hook_source(root: Path, module: str) -> Path | None:
    """The source file of a hook's module: ``<root>/<a>/<b>.py`` (or its package's
    ``__init__.py``) beside the project file first, as the worker imports it, else an installed
    module's; None when there is none."""
    local = root.joinpath(*module.split("."))
    for candidate in (local.with_suffix(".py"), local / "__init__.py"):
        if candidate.is_file():
            return candidate
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def hook_problem(root: Path, hook: str) -> tuple[str, str] | None:
    """Why ``module:function`` cannot be a hook, with the fix; None when it can."""
    import ast

    module, _, function = hook.partition(":")
    if module.partition(".")[0] in sys.stdlib_module_names:
        # Never advise a file of that name beside the project: imported first from there, it
        # would shadow the standard library's module for the hook and for everything after it.
        return (
            f"hook {hook!r}: {module.partition('.')[0]!r} is a module of Python's standard "
            "library, not the project's own code",
            f"put {function}(...) in a module of your own beside the project file, named unlike "
            f"any standard library module (e.g. prep.py, then 'prep:{function}')",
        )
    source = hook_source(root, module)
    if source is None:
        return (
            f"hook {hook!r}: no module {module!r} beside the project file or installed",
            f"create {module.replace('.', '/')}.py in {root} defining {function}(...), or "
            "install the package that has it",
        )
    try:
        data = read_bounded(source, MAX_HOOK_SOURCE_BYTES)
        if len(data) > MAX_HOOK_SOURCE_BYTES:
            raise ValueError(f"larger than {MAX_HOOK_SOURCE_BYTES // 2**20} MiB")
        tree = ast.parse(data)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"hook {hook!r}: cannot read {source}: {exc}", f"fix {source}"
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    defined |= {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    defined |= {
        (alias.asname or alias.name).split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    if function in defined:
        return None
    close = difflib.get_close_matches(function, sorted(defined), n=1)
    return (
        f"hook {hook!r}: {source.name} defines no {function!r}",
        f"did you mean {module}:{close[0]}?" if close else f"define {function}(...) in {source}",
    )


def _check_lineage(project: Project, doc: _Document) -> list[_Problem]:
    """``derived_from`` must name the baseline or another artifact, never itself."""
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    found: list[_Problem] = []
    for i, spec in enumerate(project.artifacts.candidates):
        parent = spec.derived_from
        if parent is None or parent == "baseline" or (parent in labels and parent != spec.label):
            continue
        loc: Loc = ("artifacts", "candidates", i, "derived_from")
        close = difflib.get_close_matches(parent, ["baseline", *labels], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        what = "names the artifact itself" if parent == spec.label else "names no artifact"
        found.append(
            _Problem(
                loc,
                f"{_show(parent)} {what}",
                f"{hint}use 'baseline' or one of the artifact names {labels}",
                doc.mark_for(loc),
            )
        )
    return found


def _check_models(loaded: LoadedProject, doc: _Document) -> list[_Problem]:
    """Every artifact is an ONNX model that takes the workload's inputs and whose outputs the
    tolerances can apply to."""
    project = loaded.project
    specs: list[tuple[str | int, ArtifactSpec]] = [("baseline", project.artifacts.baseline)]
    specs += [(i, spec) for i, spec in enumerate(project.artifacts.candidates)]
    problems: list[_Problem] = []
    signatures: list[tuple[list[str], ModelSignature]] = []
    for index, spec in specs:
        loc: Loc = (
            ("artifacts", index, "path")
            if index == "baseline"
            else ("artifacts", "candidates", index, "path")
        )
        try:
            signature = read_signature(loaded.resolve(spec.path))
        except ArtifactError as exc:
            problems.append(
                _Problem(
                    loc,
                    str(exc),
                    "point it at an .onnx model file (export with torch.onnx.export or "
                    "tf2onnx; check with python -m onnx.checker)",
                    doc.mark_for(loc),
                )
            )
            continue
        same = next((labels for labels, sig in signatures if _same_inputs(sig, signature)), None)
        if same is None:
            signatures.append(([spec.label], signature))
        else:
            same.append(spec.label)
    if problems:
        return problems
    pipeline = project.workload.pipeline
    for labels, signature in signatures:
        if pipeline is not None and pipeline.pre is not None:
            break  # the pre hook builds the model's feed from the workload's: it owns the match
        label = labels[0] if len(labels) == 1 else f"{labels[0]} (and {', '.join(labels[1:])})"
        problems += _workload_problems(project.workload, label, signature, doc)
    if not problems and signatures:
        problems += _tolerance_problems(project, signatures[0][1], doc)
    return problems


def _same_inputs(a: ModelSignature, b: ModelSignature) -> bool:
    return (a.inputs, a.optional_inputs) == (b.inputs, b.optional_inputs)


def _unknown_name(doc: _Document, loc: Loc, what: str, name: str, known: list[str]) -> _Problem:
    """A name the model does not have, marked on its key, with 'rename it to' the closest."""
    close = difflib.get_close_matches(name, known, n=1)
    fix = f"rename it to {close[0]!r}" if close else "use the model's names listed"
    return _Problem(loc, what, fix, doc.mark_for(loc, on_key=True))


def _listing(sigs: Sequence[TensorSignature]) -> str:
    return "; ".join(s.describe() for s in sigs) or "none"


def _workload_problems(
    workload: Workload, label: str, sig: ModelSignature, doc: _Document
) -> list[_Problem]:
    found: list[_Problem] = []
    real = f"its inputs are: {_listing(sig.inputs)}"
    names = [s.name for s in (*sig.inputs, *sig.optional_inputs)]
    renamed = {
        close[0]
        for name in workload.inputs
        if sig.input(name) is None and (close := difflib.get_close_matches(name, names, n=1))
    }
    for needed in sig.inputs:
        if needed.name not in workload.inputs and needed.name not in renamed:
            loc: Loc = ("workload", "inputs")
            found.append(
                _Problem(
                    loc,
                    f"{label} needs input {needed.describe()}, which the workload does not feed",
                    f"add {needed.name!r} under workload.inputs",
                    doc.mark_for(loc),
                )
            )
    for name, spec in workload.inputs.items():
        at: Loc = ("workload", "inputs", name)
        model_input = sig.input(name)
        if model_input is None:
            found.append(
                _unknown_name(doc, at, f"{label} has no input named {name!r}; {real}", name, names)
            )
            continue
        if model_input.dtype is not None and model_input.dtype != spec.dtype:
            found.append(
                _Problem(
                    (*at, "dtype"),
                    f"is {spec.dtype}, but input {name!r} of {label} takes "
                    f"{model_input.dtype} ({model_input.describe()})",
                    f"set dtype: {model_input.dtype}",
                    doc.mark_for((*at, "dtype")),
                )
            )
        found += _shape_problems(workload, label, name, spec, model_input, doc)
        found += _state_problems(label, name, spec, model_input, sig, doc)
    return found


def _state_problems(
    label: str,
    name: str,
    spec: InputSpec,
    model_input: TensorSignature,
    sig: ModelSignature,
    doc: _Document,
) -> list[_Problem]:
    """A ``state_from`` must name an output of the model that can be fed back as this input."""
    if spec.state_from is None:
        return []
    at: Loc = ("workload", "inputs", name, "state_from")
    output = next((o for o in sig.outputs if o.name == spec.state_from), None)
    if output is None:
        names = [o.name for o in sig.outputs]
        what = (
            f"{label} has no output named {spec.state_from!r} to feed back as {name!r}; its "
            f"outputs are: {_listing(sig.outputs)}"
        )
        return [_unknown_name(doc, at, what, spec.state_from, names)]
    differ = None
    if output.dtype is not None and model_input.dtype is not None:
        differ = "the element types differ" if output.dtype != model_input.dtype else None
    if differ is None and output.shape is not None and model_input.shape is not None:
        differ = "the ranks differ" if len(output.shape) != len(model_input.shape) else None
    if differ is not None:
        return [
            _Problem(
                at,
                f"output {output.describe()} cannot be fed back as input "
                f"{model_input.describe()}: {differ}",
                "name the output that carries this input's state",
                doc.mark_for(at),
            )
        ]
    return []


def _shape_problems(
    workload: Workload,
    label: str,
    name: str,
    spec: InputSpec,
    model_input: TensorSignature,
    doc: _Document,
) -> list[_Problem]:
    dims = model_input.shape
    if dims is None:
        return []
    at: Loc = ("workload", "inputs", name, "shape")
    theirs = f"input {name!r} of {label} is {model_input.describe()}"
    if len(dims) != len(spec.shape):
        return [
            _Problem(
                at,
                f"{spec.shape} has rank {len(spec.shape)}, but {theirs} (rank {len(dims)})",
                "give one size per model dimension, the batch axis included (at batch_axis)",
                doc.mark_for(at),
            )
        ]
    found: list[_Problem] = []
    # The batch axis is replaced by each batch size; every other axis must be what the model says.
    batch_axis = spec.batch_axis if spec.batched else None
    for axis in range(len(dims)):
        want = dims[axis]
        if axis != batch_axis and isinstance(want, int) and spec.shape[axis] != want:
            fixed = [
                d if isinstance(d, int) and i != batch_axis else size
                for i, (d, size) in enumerate(zip(dims, spec.shape, strict=True))
            ]
            mine = spec.shape[axis]
            found.append(
                _Problem(
                    at,
                    f"dimension {axis} is {mine}, but {theirs}"
                    if isinstance(mine, int)
                    else f"dimension {axis} is swept as {mine!r} (workload.dims), but {theirs}: "
                    "the model takes one size there",
                    f"set shape: {fixed}",
                    doc.mark_for(at),
                )
            )
            break
    batch = dims[batch_axis] if batch_axis is not None else None
    if isinstance(batch, int):
        wrong = [b for b in workload.batch_sizes if b != batch]
        if wrong:
            loc: Loc = ("workload", "batch_sizes")
            found.append(
                _Problem(
                    loc,
                    f"batch size(s) {wrong} cannot run: {theirs}, a fixed batch axis of {batch}"
                    + (f" (axis {batch_axis})" if batch_axis else ""),
                    f"use batch_sizes: [{batch}], or export the model with a dynamic batch axis",
                    doc.mark_for(loc),
                )
            )
    return found


def _top1_unfit(sig: TensorSignature) -> str | None:
    """Why arg-max agreement cannot apply to an output, or None when it can."""
    if sig.dtype is not None and not sig.dtype.startswith(("float", "bfloat")):
        return f"its elements are {sig.dtype}, not scores"
    if sig.shape is not None and len(sig.shape) < 2:
        return f"it has rank {len(sig.shape)}; arg-max agreement needs [samples, ..., classes]"
    if sig.shape is not None and sig.shape[-1] == 1:
        return "its last axis has one element, so every arg-max is 0"
    return None


def _tolerance_problems(
    project: Project, baseline: ModelSignature, doc: _Document
) -> list[_Problem]:
    found: list[_Problem] = []
    outputs = [s.name for s in baseline.outputs]
    for name in project.workload.outputs:
        if baseline.output(name) is None:
            what = (
                f"the baseline has no output named {name!r}; its outputs are: "
                f"{_listing(baseline.outputs)}"
            )
            found.append(_unknown_name(doc, ("workload", "outputs", name), what, name, outputs))
    for family, tolerance in project.parity.families().items():
        for name, override in tolerance.outputs.items():
            loc: Loc = ("parity", family, "outputs", name)
            sig = baseline.output(name)
            if sig is None:
                what = (
                    f"the baseline has no output named {name!r}; its outputs are: "
                    f"{_listing(baseline.outputs)}"
                )
                found.append(_unknown_name(doc, loc, what, name, outputs))
                continue
            why = _top1_unfit(sig) if override.top1_agreement_min is not None else None
            if why is not None:
                at = (*loc, "top1_agreement_min")
                found.append(
                    _Problem(
                        at,
                        f"cannot apply to output {sig.describe()}: {why}",
                        "remove it, or set it on an output of class scores",
                        doc.mark_for(at),
                    )
                )
        if "top1_agreement_min" in tolerance.model_fields_set and all(
            _top1_unfit(s) is not None for s in baseline.outputs
        ):
            at = ("parity", family, "top1_agreement_min")
            found.append(
                _Problem(
                    at,
                    "cannot apply to any output of the baseline: "
                    + "; ".join(f"{s.describe()} ({_top1_unfit(s)})" for s in baseline.outputs),
                    "remove it; max_abs, max_rel and cosine_min apply to every output",
                    doc.mark_for(at),
                )
            )
    return found


def dump_project(project: Project, *, include_defaults: bool = False) -> str:
    """The project as readable YAML that loads back to an equal project.

    Args:
        project: The project to write.
        include_defaults: Also write fields that were never set, with their default values (a
            longer, explicit file). Otherwise only fields set explicitly are written.

    Returns:
        YAML text with the keys in the model's order: model, artifacts, workload, parity,
        policy, host_classes; short lists and mappings of scalars on one line.
    """
    # Unset fields are left out, so the file says what its author (or the demo) chose and the
    # defaults stay in one place: the model.
    data = project.model_dump(mode="json", exclude_unset=not include_defaults)
    if include_defaults:
        # A parity limit left out inherits and a null one is off (`Project.tolerance`): the
        # parity entries are written as set, or every limit left out would come back off.
        data["parity"] = project.parity.model_dump(mode="json", exclude_unset=True)
    text = _dump(data, allow_unicode=True)
    if _reader().load(text) != data:
        # The emitter mangles a few line-break characters (U+0085) in single-quoted scalars
        # when writing Unicode as is; escaping everything outside ASCII writes them faithfully.
        text = _dump(data, allow_unicode=False)
    return text


def _dump(data: object, *, allow_unicode: bool) -> str:
    writer = YAML(typ="safe", pure=True)
    writer.default_flow_style = None  # short lists and mappings of scalars on one line
    writer.width = 100
    writer.allow_unicode = allow_unicode
    writer.representer.sort_base_mapping_type_on_output = False  # the model's key order
    out = io.StringIO()
    writer.dump(data, out)
    return out.getvalue()


def write_project(project: Project, path: Path, *, include_defaults: bool = False) -> None:
    """Write the project file atomically (temp file in the same folder, fsync, rename).

    Args:
        project: The project to write.
        path: Where to write it; an existing file is replaced only once the new one is complete.
        include_defaults: See ``dump_project``.

    Raises:
        OSError: the folder does not exist or is not writable; nothing is left half-written.
    """
    text = dump_project(project, include_defaults=include_defaults)
    write_atomic(path, text, sync_dir=True)
