"""``qualify manifest``: generate, publish, verify, compare and show release manifests
(`qualify.release`, `manifest`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qualify.cli.errors import _fail
from qualify.cli.options import _db_option, _project_option, _RegularFile, _require_db
from qualify.cli.output import echo_json, json_option
from qualify.cli.publish import Publishing, _recover, _warn_if_hosts_refuse, publish_options

__all__ = ["manifest_group"]


@click.group("manifest")
def manifest_group() -> None:
    """Generate, verify, compare and show signed release manifests."""


def _echo_published(result: Any, out: Path, per_class_dir: Path | None) -> None:
    from qualify.text import one_line

    # The document as written (built from validated parts and checked as a host checks it):
    # reading it back into the model would cost as much as signing a large fleet's.
    signed = result.document["signed"]
    click.echo(
        f"manifest {out}: release {signed['release']} version {signed['version']}, "
        f"{'signed' if result.signed else 'UNSIGNED'}, expires {signed['expires']}, published"
    )
    for name, entry in signed["entries"].items():
        kept = result.kept.get(name)
        click.echo(
            f"  {one_line(name)}: {entry['decision']} — {one_line(entry['summary'])}"
            + (f" [kept: {kept}]" if kept else "")
        )
    if per_class_dir is not None:
        click.echo(f"per-class documents: {per_class_dir}")
    _warn_dropped(result.dropped, "and publish again")
    _warn_if_hosts_refuse(out, per_class_dir, int(signed["version"]), str(signed["model"]))


_DROPPED_SHOWN = 10
"""Dropped classes named one per line; more are counted (a fleet retired at once)."""


def _warn_dropped(dropped: dict[str, str], then: str) -> None:
    """Say, on stderr, which classes the published manifest had and this one has not."""
    from qualify.text import one_line

    for name, was in list(dropped.items())[:_DROPPED_SHOWN]:
        click.echo(
            f"warning: {one_line(name)} has no entry here ({one_line(was)}): the project file "
            "no longer lists the class, so its hosts will find none (resolve-artifact exits 2)",
            err=True,
        )
    more = len(dropped) - _DROPPED_SHOWN
    if more > 0:
        click.echo(f"warning: {more} more classes of the published manifest have none", err=True)
    if dropped:
        click.echo(
            "warning: if those hosts still run, put their classes back in the project file " + then,
            err=True,
        )


def _draft_validity(publishing: Publishing) -> Any:
    """How long the draft is valid; signing options are refused for a draft."""
    from qualify.release.generate import MAX_VALIDITY, parse_duration

    if publishing.key_path is not None or publishing.unsigned or publishing.per_class_dir:
        _fail(
            "a draft is not signed: add --publish to sign and publish now, or run "
            "qualify manifest publish --key KEYFILE after reviewing the draft"
        )
    if publishing.who is not None or publishing.why is not None:
        _fail(
            "a draft is not published, so nobody publishes it yet: add --publish to publish "
            "now, or pass --who/--why to qualify manifest publish after reviewing the draft"
        )
    return parse_duration(publishing.expires, what="--expires", most=MAX_VALIDITY)


def _echo_draft(draft: Any, target: Path, release: str) -> None:
    """What ``manifest generate`` says of the draft it wrote, and what to run next."""
    from qualify.text import one_line

    click.echo(f"draft {target}: release {release} version {draft.version}, not published")
    for name, entry in draft.signed["entries"].items():
        kept = draft.kept.get(name)
        click.echo(
            f"  {one_line(name)}: {entry['decision']} — {one_line(entry['summary'])}"
            + (f" [kept: {kept}]" if kept else "")
        )
    _warn_dropped(draft.dropped, "and generate again")
    click.echo(
        f"next: qualify manifest diff manifest.json {target}, then "
        f"qualify manifest publish {target} --key KEYFILE"
    )


@manifest_group.command("generate")
@click.option("--release", required=True, help="Release name, e.g. digits-2026.12.")
@click.option(
    "--publish",
    "publish_now",
    is_flag=True,
    help="Publish at once (as 'qualify manifest publish' would): needs --key or --unsigned.",
)
@publish_options(
    out_help="File to write: the draft (default manifest.draft.json), or with --publish the "
    "published manifest (default manifest.json).",
    out_default=None,
    unsigned=True,
    asks=True,
)
@click.option(
    "--artifact-base-uri",
    help="Base URL hosts fetch artifacts from (BASE/sha256/<hex>.onnx); default: file:// URIs "
    "of the artifact store beside the matrix.",
)
@_project_option
@_db_option
def manifest_generate(
    release: str,
    publish_now: bool,
    publishing: Publishing,
    artifact_base_uri: str | None,
    project_path: Path,
    db_path: Path,
) -> None:
    """Decide every host class from the matrix and write a draft manifest (or, with
    --publish, sign and publish it at once).

    A class gets the candidate only where its own (hardware, runtime, provider) cell passed
    every gate; otherwise the approved baseline, or the unknown-class policy without evidence.
    A class being rolled out, held or pinned keeps its published entry. A draft is unsigned and
    nothing treats it as current: review it (qualify manifest show / diff), then run
    qualify manifest publish.
    """
    from datetime import UTC, datetime

    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message
    from qualify.project.load import load_project
    from qualify.project.view import record_view
    from qualify.release.generate import draft_manifest, generate_manifest

    validity = publishing.validity() if publish_now else _draft_validity(publishing)
    target = publishing.out or Path("manifest.json" if publish_now else "manifest.draft.json")
    loaded = load_project(project_path)
    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message(), model=loaded.project.model) as db:
        _recover(db)
        record_view(db, loaded.project, loaded.sha256)
        if publish_now:
            result = generate_manifest(
                loaded,
                db,
                publishing.options(out=target),
                release=release,
                artifact_base_uri=artifact_base_uri,
            )
            _echo_published(result, target, publishing.per_class_dir)
            return
        draft = draft_manifest(
            loaded,
            db,
            release=release,
            out=target,
            now=datetime.now(UTC),
            expires_in=validity,
            artifact_base_uri=artifact_base_uri,
        )
    _echo_draft(draft, target, release)


@manifest_group.command("publish")
@click.argument("draft", required=False, type=_RegularFile(exists=True))
@publish_options(
    out_help="Manifest file hosts read (replaced atomically).", unsigned=True, asks=True
)
@_db_option
def manifest_publish(draft: Path | None, publishing: Publishing, db_path: Path) -> None:
    """Sign the draft DRAFT (default: the matrix's newest) and make it the current manifest.

    DRAFT must be exactly what manifest generate recorded; a draft older than a published
    version (a rollout step came after it) is refused: generate a new one.
    """
    from matrix.store import Store
    from qualify.measure.hostlock import lock_wait_message
    from qualify.release.generate import publish_manifest

    publishing.validity()  # a bad --expires or signing choice fails before the matrix opens
    _require_db(db_path)
    with Store.open(db_path, on_wait=lock_wait_message()) as db:
        _recover(db)
        options = publishing.options()
        result = publish_manifest(db, options, draft_path=draft)
    _echo_published(result, options.out, publishing.per_class_dir)


@manifest_group.command("history")
@_db_option
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Only the newest N versions (still oldest first); says how many earlier ones it "
    "leaves out.",
)
@json_option("manifest-history")
def manifest_history(db_path: Path, last: int | None, as_json: bool) -> None:
    """Every manifest version the matrix records, oldest first: whether it was published (or
    is a draft, or was discarded), when, by whom and why (--who/--why of manifest publish, a
    rollout step's actor and reason; "not recorded" for a version published before qualify
    recorded them)."""
    from qualify.release.history import newest, read_history, render_history

    _require_db(db_path)
    versions, earlier = newest(read_history(db_path), last)
    if as_json:
        from schemas.output import ManifestHistory

        echo_json(ManifestHistory(versions=versions, earlier=earlier))
        return
    click.echo(render_history(versions, earlier=earlier))


@manifest_group.command("verify")
@click.argument("path", type=_RegularFile(exists=True))
@click.option(
    "--pubkey",
    required=True,
    type=_RegularFile(exists=True),
    help="Trusted public key (NAME.pub).",
)
@json_option("manifest-verify")
def manifest_verify(path: Path, pubkey: Path, as_json: bool) -> None:
    """Check a manifest's signature, format and expiry."""
    from datetime import UTC, datetime

    from manifest.load import load_manifest, read_manifest_file
    from manifest.signing import load_public_key, verify

    raw = read_manifest_file(path)
    verify(raw, load_public_key(pubkey), now=datetime.now(UTC), source=str(path))
    manifest = load_manifest(raw, source=str(path))
    if as_json:
        from schemas.output import ManifestVerified

        signed = manifest.signed
        echo_json(
            ManifestVerified(
                path=str(path),
                valid=True,
                release=signed.release,
                version=signed.version,
                classes=len(signed.entries),
                expires=signed.expires,
            )
        )
        return
    click.echo(
        f"{path}: OK — release {manifest.signed.release} version {manifest.signed.version}, "
        f"{len(manifest.signed.entries)} classes, expires {manifest.signed.expires}"
    )


@manifest_group.command("diff")
@click.argument("old", type=_RegularFile(exists=True))
@click.argument("new", type=_RegularFile(exists=True))
@json_option("manifest-diff")
def manifest_diff(old: Path, new: Path, as_json: bool) -> None:
    """Say which host class changes from what to what between two manifests, and why."""
    from manifest.diff import diff_manifests, render_changes
    from manifest.load import load_manifest, read_manifest_file

    a = load_manifest(read_manifest_file(old), source=str(old))
    b = load_manifest(read_manifest_file(new), source=str(new))
    changes = diff_manifests(a, b)
    if as_json:
        from schemas.output import ManifestDiffShown

        echo_json(ManifestDiffShown(old=str(old), new=str(new), changes=changes))
        return
    click.echo(render_changes(changes, a, b))


@manifest_group.command("show")
@click.argument(
    "path",
    type=_RegularFile(exists=True),
    default="manifest.json",
)
@json_option("manifest")
def manifest_show(path: Path, as_json: bool) -> None:
    """Print a manifest for people: per class, the decision, the artifact and why (with --json:
    the document as read and validated; its signature is not checked: manifest verify)."""
    from manifest.load import load_manifest, read_manifest_file

    manifest = load_manifest(read_manifest_file(path), source=str(path))
    if as_json:
        echo_json(manifest)
        return
    from manifest.show import render_manifest

    click.echo(render_manifest(manifest))
