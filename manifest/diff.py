"""Comparing two manifests: what changes for each host class, from what to what, and why.

Owns ``diff_manifests`` (pure: two manifest models in, one ``schemas.manifest.ClassChange`` per
class that changes out) and ``render_changes``, the text of ``qualify manifest diff``; the
report's "changes since the previous manifest" reads the same diff. Does not own reading the
files (``manifest.load``), the models (``schemas.manifest``) nor how one manifest reads for
people (``manifest.show``).
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.manifest import ChangeSide, ClassChange, Manifest, ManifestEntry

__all__ = ["diff_manifests", "render_changes"]


def _side(entry: ManifestEntry) -> ChangeSide:
    return ChangeSide(
        decision=entry.decision,
        artifact_name=entry.artifact.name if entry.artifact else None,
        artifact_digest=entry.artifact.digest if entry.artifact else None,
        rollback_digest=entry.rollback.digest if entry.rollback else None,
    )


def _label(side: ChangeSide) -> str:
    if side.decision == "hold":
        return "hold"
    return f"{side.decision} {side.artifact_name}"


def diff_manifests(a: Manifest, b: Manifest) -> list[ClassChange]:
    """What changes for each class from manifest ``a`` to manifest ``b``, and why.

    Args:
        a: the older manifest.
        b: the newer one.

    Returns:
        One change per class that was added, removed, or whose decision, artifact, rollback,
        runtime, provider or match rules differ; sorted by class name. Unchanged classes are
        left out.
    """
    old, new = a.signed.entries, b.signed.entries
    changes = (_change(name, old.get(name), new.get(name)) for name in sorted(set(old) | set(new)))
    return [change for change in changes if change is not None]


def _change(
    name: str, before: ManifestEntry | None, after: ManifestEntry | None
) -> ClassChange | None:
    """How one class changed between two entries (None: one side only, or none that differs)."""
    if before is None and after is not None:
        side = _side(after)
        return ClassChange(
            host_class=name,
            change="added",
            before=None,
            after=side,
            fields=["class"],
            reasons=after.reasons,
            summary=f"{name}: new class, gets {_label(side)}. {after.summary}",
        )
    if after is None and before is not None:
        return ClassChange(
            host_class=name,
            change="removed",
            before=_side(before),
            after=None,
            fields=["class"],
            reasons=[],
            summary=f"{name}: no longer in the manifest (was {_label(_side(before))}).",
        )
    if before is None or after is None:
        return None  # unreachable: a name comes from one side or the other
    fields = [
        field
        for field, x, y in (
            ("decision", before.decision, after.decision),
            ("artifact", before.artifact, after.artifact),
            ("rollback", before.rollback, after.rollback),
            ("runtime", before.runtime, after.runtime),
            ("provider", before.provider, after.provider),
            ("match", before.match, after.match),
        )
        if x != y
    ]
    if not fields:
        return None
    x, y = _side(before), _side(after)
    what = (
        f"{_label(x)} -> {_label(y)}"
        if ("decision" in fields or "artifact" in fields)
        else f"still {_label(y)}; {', '.join(fields)} changed"
    )
    return ClassChange(
        host_class=name,
        change="changed",
        before=x,
        after=y,
        fields=fields,
        reasons=after.reasons,
        summary=f"{name}: {what}. {after.summary}",
    )


def render_changes(changes: Sequence[ClassChange], a: Manifest, b: Manifest) -> str:
    """A diff for people: a header line, then one line per change and its reason codes."""
    head = (
        f"{a.signed.release} (version {a.signed.version}) -> "
        f"{b.signed.release} (version {b.signed.version}): "
    )
    if not changes:
        return head + "no class changes.\n"
    lines = [head + f"{len(changes)} class(es) change."]
    for change in changes:
        lines.append(f"  {change.summary}")
        codes = ", ".join(dict.fromkeys(r.code for r in change.reasons))
        if codes:
            lines.append(f"      reasons: {codes}")
    return "\n".join(lines) + "\n"
