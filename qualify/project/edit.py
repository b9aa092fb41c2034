"""Edits qualify makes to the user's project file, keeping their comments and layout.

Owns changing ``qualify.yaml`` in place: ``qualify tune`` sets a class's tuned session settings,
``qualify candidates`` adds the variants it made. Each edit goes through ruamel.yaml's
round-trip mode (comments, key order, quoting and flow style survive), the new text is
validated as a whole project (`qualify.project.load.parse_project`) before anything is written, and
the file is replaced atomically, so a failed edit leaves the old file exactly as it was.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from qualify.errors import ProjectError
from qualify.project.load import parse_project
from qualify.project.problems import no_such_class
from qualify.project.view import MAX_PROJECT_BYTES
from schemas.atomic import read_bounded, write_atomic
from schemas.project import Project

__all__ = ["add_candidates", "set_class_provider"]


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.indent(mapping=2, sequence=2, offset=0)  # as `dump_project` writes (`qualify demo`, init)
    return yaml


def _edit(path: Path, change: Callable[[CommentedMap], None]) -> Project:
    """Apply ``change`` to the file's document, validate the result, write it atomically."""
    yaml = _yaml()
    try:
        data = read_bounded(path, MAX_PROJECT_BYTES)  # a pipe or a device is refused by name
        if len(data) > MAX_PROJECT_BYTES:
            raise ProjectError(f"{path}: larger than a project file; nothing was changed")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ProjectError(f"{path}: cannot read the project file: {why}") from exc
    doc = yaml.load(text)
    if not isinstance(doc, CommentedMap):
        raise ProjectError(f"{path}: the project file is not a mapping; nothing was changed")
    change(doc)
    out = io.StringIO()
    yaml.dump(doc, out)
    new_text = out.getvalue()
    try:
        project = parse_project(new_text, source=str(path))
    except ProjectError as exc:
        raise ProjectError(f"{exc}\n(the edit was not written; {path} is unchanged)") from exc
    write_atomic(path, new_text, sync_dir=True)
    return project


def _plain(value: Any) -> Any:
    """Lists and mappings as ruamel's commented types, written in flow style when short."""
    if isinstance(value, Mapping):
        out = CommentedMap()
        for key, item in value.items():
            out[key] = _plain(item)
        return out
    if isinstance(value, list | tuple):
        seq = CommentedSeq([_plain(v) for v in value])
        if all(not isinstance(v, Mapping | list | tuple) for v in value):
            seq.fa.set_flow_style()
        return seq
    return value


def set_class_provider(path: Path, class_name: str, updates: Mapping[str, Any]) -> Project:
    """Set fields of one class's ``provider`` section (``None`` removes a field).

    Raises:
        ProjectError: the class is not in the file, or the result is not a valid project
            (the file is then unchanged).
    """

    def change(doc: CommentedMap) -> None:
        classes = doc.get("host_classes")
        if not isinstance(classes, CommentedMap) or class_name not in classes:
            known = classes if isinstance(classes, CommentedMap) else ()
            raise ProjectError(no_such_class(path, class_name, [str(c) for c in known]))
        cls = classes[class_name]
        if cls.get("provider") is None:
            cls["provider"] = CommentedMap()
        provider = cls["provider"]
        for key, value in updates.items():
            if value is None:
                provider.pop(key, None)
            else:
                provider[key] = _plain(value)

    return _edit(path, change)


def add_candidates(path: Path, entries: Sequence[Mapping[str, Any]]) -> Project:
    """Append candidates to ``artifacts.candidates``, replacing any of the same name.

    Raises:
        ProjectError: the result is not a valid project (the file is then unchanged).
    """

    def change(doc: CommentedMap) -> None:
        artifacts = doc.get("artifacts")
        if not isinstance(artifacts, CommentedMap):
            raise ProjectError(f"{path}: 'artifacts' is not a mapping")
        found = artifacts.get("candidates")
        if not isinstance(found, CommentedSeq):
            found = CommentedSeq(list(found or []))
            artifacts["candidates"] = found
        names = {str(e["name"]) for e in entries}
        keep = [c for c in found if not (isinstance(c, Mapping) and c.get("name") in names)]
        found.clear()
        found.extend(keep)
        found.extend(_plain(e) for e in entries)

    return _edit(path, change)
