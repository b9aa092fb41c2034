"""One manifest as text for people: what ``qualify manifest show`` prints.

Owns ``render_manifest``: a header (release, version, times, snapshot, policy, signing keys),
then per class its decision, artifact, rollback and the one-line reason. Computes nothing the
manifest does not say. Does not own reading the file (``manifest.load``) nor comparing two
manifests (``manifest.diff``).
"""

from __future__ import annotations

from schemas.manifest import Manifest

__all__ = ["render_manifest"]


_EMULATED = {
    True: "allowed",
    "parity": "ignored but for parity on an emulated CPU of the class's ISA",
    False: "ignored",
}
"""How ``policy.allow_emulated`` reads in a manifest's header line."""


def render_manifest(manifest: Manifest) -> str:
    """A manifest for people: header, then one line per class with its decision and why."""
    s = manifest.signed
    lines = [
        f"{s.model} release {s.release}, version {s.version}, created {s.created}, "
        f"expires {s.expires}, snapshot {s.snapshot}",
        f"policy: unknown classes -> {s.policy.unknown_class}, emulated cells "
        f"{_EMULATED[s.policy.allow_emulated]}, choose {s.policy.choose}",
        f"signatures: {', '.join(sig.keyid[:16] for sig in manifest.signatures) or 'UNSIGNED'}",
    ]
    for name in sorted(s.entries):
        entry = s.entries[name]
        target = "hold" if entry.artifact is None else f"{entry.decision} {entry.artifact.name}"
        rollback = (
            ("none (nothing further to go back to)" if entry.decision == "baseline" else "none")
            if entry.rollback is None
            else f"{entry.rollback.name}"
            + ("" if entry.rollback.proven_to_load else " (not proven to load)")
        )
        lines.append(f"  {name}: {target}; rollback {rollback}")
        lines.append(f"      {entry.summary}")
    return "\n".join(lines) + "\n"
