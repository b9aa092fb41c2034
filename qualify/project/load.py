"""Loading and writing the project file (``qualify.yaml``).

Owns reading the YAML while keeping the line and column of every key and value (duplicate keys,
alias loops and alias bombs refused), validating it against ``schemas.project.Project``, then
the checks beyond the model (``qualify.project.checks``); and writing a project back as readable
YAML, atomically.

Does not own the models or their rules (``schemas.project``), how a problem is worded
(``qualify.project.problems``), loading artifacts or input arrays (shapes and dtypes are checked
by the run), nor printing the error (``qualify.cli``).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, StreamMark, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from qualify.errors import ProjectError
from qualify.project.checks import model_problems, reference_problems
from qualify.project.loaded import LoadedProject
from qualify.project.problems import Document, Loc, Problem, fail, problem_from_error, show
from qualify.project.view import MAX_PROJECT_BYTES
from schemas.atomic import read_bounded, write_atomic
from schemas.project import Project

__all__ = [
    "PROJECT_FILENAME",
    "LoadedProject",
    "dump_project",
    "load_project",
    "load_project_text",
    "parse_project",
    "write_project",
]

PROJECT_FILENAME = "qualify.yaml"
"""The project file's default name."""

MAX_NODES = 100_000
"""Most values a project file may hold once its aliases are expanded (a 'billion laughs' of
nested aliases is refused here, not expanded)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a project file may have."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Builder:
    """Turns a composed YAML node tree into plain data, recording marks and refusing duplicates."""

    def __init__(self, constructor: SafeConstructor, display: str) -> None:
        self._constructor = constructor
        self.display = display
        self.count = 0
        self.doc = Document()

    def build(self, node: Node) -> Document:
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
            raise fail(
                self.display,
                None,
                [
                    Problem(
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
                Problem(
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
            Problem(
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
                    Problem(
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


def _reader() -> YAML:
    # ruamel's pure-Python safe loader: plain values only (a tag that would build an object is
    # refused) and a mark for every node. YAML 1.2, as the round-trip edits (`edit.py`) read it:
    # `yes`, `on` and `off` are text, not booleans.
    return YAML(typ="safe", pure=True)


def _compose(text: str, display: str) -> Document:
    reader = _reader()
    try:
        node = reader.compose(text)
        if node is None:
            raise fail(
                display,
                None,
                [
                    Problem(
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
        raise fail(
            display, None, [Problem((), f"not valid YAML: {what}{source}", fix, mark)]
        ) from exc
    except YAMLError as exc:
        raise fail(display, None, [Problem((), f"not valid YAML: {exc}", None)]) from exc
    except RecursionError:
        raise fail(
            display,
            None,
            [
                Problem(
                    (),
                    f"nested more than {MAX_DEPTH} levels deep",
                    "write the settings out plainly",
                )
            ],
        ) from None
    return doc


def _validate(doc: Document, display: str) -> Project:
    if not isinstance(doc.data, dict):
        allowed = ", ".join(Project.model_fields)
        raise fail(
            display,
            doc,
            [
                Problem(
                    (),
                    f"the top level must be a mapping with keys {allowed}; found {show(doc.data)}",
                    "run 'qualify demo --workdir DIR' to see an example project file",
                    doc.value_marks.get(()),
                )
            ],
        )
    problems = list(doc.problems)
    try:
        project = Project.model_validate(doc.data)
    except ValidationError as exc:
        problems += [problem_from_error(e, doc) for e in exc.errors(include_url=False)]
        cause: Exception | None = exc
    else:
        cause = None
    if problems:
        problems.sort(key=lambda p: (p.mark.line, p.mark.column) if p.mark else (-1, -1))
        raise fail(display, doc, problems) from cause
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

    problems = reference_problems(loaded, doc)
    if problems:
        raise fail(display, doc, problems)
    problems = model_problems(loaded, doc) if check_models else []
    if problems:
        raise fail(display, doc, problems)
    return loaded


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
