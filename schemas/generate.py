"""Generate the published JSON Schema files from the pydantic models, and check them for drift.

Owns the registry of published documents (one ``<name>.schema.json`` per document model), the
deterministic rendering of each schema, the ``--check`` drift mode and the check that every field
of every registered model is described. Does not own the models themselves, nor validating
documents against the schemas (the models do that at run time; the schemas are for editors and
other tools).

Usage::

    python -m schemas.generate            # rewrite stale schema files
    python -m schemas.generate --check    # exit 1 and name stale files, write nothing
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel

from schemas.atomic import write_atomic

__all__ = [
    "DOCUMENTS",
    "JSON_SCHEMA_DIALECT",
    "SCHEMA_DIR",
    "SCHEMA_ID_BASE",
    "generate",
    "load_model",
    "main",
    "render_schema",
    "undescribed_fields",
]

SCHEMA_DIR = Path(__file__).resolve().parent
"""Where the schema files live (beside the models, shipped as package data)."""

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID_BASE = "urn:qualify:schema:"
"""Prefix of every schema's ``$id``: a URN, since the schemas are not served from any host."""

DOCUMENTS: list[tuple[str, str]] = [
    ("project.schema.json", "schemas.project:Project"),
    ("fingerprint.schema.json", "schemas.host:Fingerprint"),
    ("cell.schema.json", "schemas.cell:Cell"),
    ("run-bundle.schema.json", "schemas.cell:RunBundle"),
    ("manifest.schema.json", "schemas.manifest:Manifest"),
    ("class-manifest.schema.json", "schemas.manifest:ClassDocument"),
    ("telemetry-event.schema.json", "schemas.telemetry:TelemetryEvent"),
    ("telemetry-check.schema.json", "schemas.telemetry:TelemetryCheck"),
    ("emulator-runtime.schema.json", "schemas.emulation:PreparedRuntime"),
    ("tune-record.schema.json", "schemas.tune:TuneRecord"),
    # What the read commands print with --json (schemas.output).
    ("matrix-show.schema.json", "schemas.output:MatrixShown"),
    ("matrix-stale.schema.json", "schemas.output:MatrixStale"),
    ("matrix-gate.schema.json", "schemas.output:MatrixGateShown"),
    ("matrix-export.schema.json", "schemas.output:ExportedFiles"),
    ("matrix-ingest.schema.json", "schemas.output:BundlesIngested"),
    ("telemetry-ingest.schema.json", "schemas.output:TelemetryIngested"),
    ("run-summary.schema.json", "schemas.output:RunSummary"),
    ("manifest-verify.schema.json", "schemas.output:ManifestVerified"),
    ("manifest-diff.schema.json", "schemas.output:ManifestDiffShown"),
    ("manifest-history.schema.json", "schemas.output:ManifestHistory"),
    ("rollout-status.schema.json", "schemas.output:RolloutStatusShown"),
    ("rollout-log.schema.json", "schemas.output:RolloutLog"),
    ("emulators-show.schema.json", "schemas.output:EmulatorsShow"),
    ("fleet-status.schema.json", "schemas.output:FleetStatusShown"),
]
"""The published documents: (file name, ``module:Model``). Models are imported only when needed,
so a line may be added before other code imports its module."""

_SUFFIX = ".schema.json"


def load_model(dotted: str) -> type[BaseModel]:
    """Import a model from ``package.module:ClassName``.

    Args:
        dotted: The module path and class name, separated by a colon.

    Returns:
        The pydantic model class.

    Raises:
        ValueError: the path is not ``module:Class`` or does not name a pydantic model.
        ImportError: the module cannot be imported.
    """
    module_name, sep, attr = dotted.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:ClassName', found {dotted!r}")
    obj = getattr(importlib.import_module(module_name), attr, None)
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise ValueError(f"{dotted!r} does not name a pydantic model")
    return obj


def render_schema(filename: str, model: type[BaseModel]) -> str:
    """The JSON Schema text of one document: deterministic, sorted keys, indent 2, newline.

    Args:
        filename: The schema's file name; it becomes the last part of ``$id``.
        model: The document model.

    Returns:
        The file's text.
    """
    schema = model.model_json_schema(mode="validation")
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$id"] = SCHEMA_ID_BASE + filename.removesuffix(_SUFFIX)
    schema["title"] = model.__name__
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    write_atomic(path, text)


def generate(
    check: bool = False,
    *,
    directory: Path | None = None,
    documents: Sequence[tuple[str, str]] | None = None,
) -> list[str]:
    """Bring the schema files up to date, or only say which are stale.

    A file is stale when its text differs from a fresh rendering, when it is missing, or when it
    is a ``*.schema.json`` in the folder that no registered document produces (an orphan).

    Args:
        check: Only compare; write and delete nothing.
        directory: The schema folder; defaults to ``SCHEMA_DIR``.
        documents: The registry; defaults to ``DOCUMENTS``.

    Returns:
        The stale file names, sorted. Without ``check`` these were rewritten (orphans deleted).

    Raises:
        ImportError, ValueError: a registered model cannot be loaded (see ``load_model``).
    """
    folder = SCHEMA_DIR if directory is None else directory
    registry = DOCUMENTS if documents is None else documents
    stale: list[str] = []
    wanted: set[str] = set()
    for filename, dotted in registry:
        wanted.add(filename)
        text = render_schema(filename, load_model(dotted))
        path = folder / filename
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != text:
            stale.append(filename)
            if not check:
                _write_atomic(path, text)
    for orphan in sorted(folder.glob(f"*{_SUFFIX}")):
        if orphan.name not in wanted:
            stale.append(orphan.name)
            if not check:
                orphan.unlink()
    return sorted(stale)


def _models_in(tp: object) -> Iterator[type[BaseModel]]:
    """Every pydantic model a type annotation mentions (through lists, dicts and unions)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield tp
        return
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        yield from _models_in(typing.get_args(tp)[0])
        return
    if origin is not None or isinstance(tp, types.UnionType):
        for arg in typing.get_args(tp):
            yield from _models_in(arg)


def undescribed_fields(documents: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """Fields (and models) of the registered documents that have no description.

    Descriptions become the published schema's documentation, so every field needs one. Nested
    models are followed through lists, dicts and unions.

    Args:
        documents: The registry; defaults to ``DOCUMENTS``.

    Returns:
        ``Model.field`` for each undescribed field and ``Model`` for each model without a
        docstring, sorted; empty when everything is described.
    """
    registry = DOCUMENTS if documents is None else documents
    pending = [load_model(dotted) for _, dotted in registry]
    seen: set[type[BaseModel]] = set()
    missing: set[str] = set()
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        if not (model.__doc__ or "").strip():
            missing.add(model.__name__)
        for name, info in model.model_fields.items():
            if not (info.description or "").strip():
                missing.add(f"{model.__name__}.{name}")
            pending.extend(_models_in(info.annotation))
    return sorted(missing)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry: ``python -m schemas.generate [--check]``.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        0 when the files are (now) up to date, 1 with ``--check`` when some are stale.
    """
    parser = argparse.ArgumentParser(
        prog="python -m schemas.generate",
        description="Write the JSON Schema files of the qualify documents into schemas/.",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 and name stale files; write nothing"
    )
    args = parser.parse_args(argv)
    stale = generate(check=args.check)
    if args.check:
        if stale:
            print(
                f"stale schema files in {SCHEMA_DIR}: {', '.join(stale)}; "
                "run: python -m schemas.generate",
                file=sys.stderr,
            )
            return 1
        print("schema files are up to date")
        return 0
    for name in stale:
        print(f"{'wrote' if (SCHEMA_DIR / name).exists() else 'deleted'} {SCHEMA_DIR / name}")
    if not stale:
        print("schema files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
