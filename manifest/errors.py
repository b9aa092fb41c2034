"""The error tree of the ``manifest`` package.

Owns every exception ``manifest`` raises on purpose; the CLI turns them into messages and exit
codes in one place. Does not own the exit codes of ``resolve-artifact`` (``manifest.resolve``
maps these errors to them). Standard library only: ``resolve-artifact`` imports this module.

::

    ManifestError                  anything this package refuses, with a message a person can act on
    ├── PolicyError                the inputs of a decision do not fit together
    ├── BuildError                 a manifest cannot be built or written as asked
    ├── KeyFileError               a key file is missing, malformed or of the wrong kind
    ├── CanonicalError             a value canonical JSON cannot hold (a float, a non-string key)
    └── VerificationError          a document failed a check; ``code`` says which
        ├── MalformedError         not JSON, wrong shape, wrong type, or larger than allowed
        ├── SignatureError         no valid signature by the trusted key
        ├── ExpiredError           past its ``expires``
        ├── RollbackError          ``version`` lower than the one this host last accepted
        ├── ForkError              the version this host accepted, with different content
        ├── ValidityError          valid for longer than the host's policy allows
        ├── ClassMismatchError     a per-class document read under another class's name
        ├── LineMismatchError      a document of another model line than the one asked for
        └── PointerMismatchError   a per-class set's ``current`` names another version
"""

from __future__ import annotations

__all__ = [
    "BuildError",
    "CanonicalError",
    "ClassMismatchError",
    "ExpiredError",
    "ForkError",
    "KeyFileError",
    "LineMismatchError",
    "MalformedError",
    "ManifestError",
    "PointerMismatchError",
    "PolicyError",
    "RollbackError",
    "SignatureError",
    "ValidityError",
    "VerificationError",
]


class ManifestError(Exception):
    """Base of every error ``manifest`` raises on purpose."""


class PolicyError(ManifestError):
    """The project, cells and runs handed to the decision policy do not fit together."""


class BuildError(ManifestError):
    """A manifest cannot be built or written as asked (version, artifact locations, names)."""


class KeyFileError(ManifestError):
    """A key file is missing, unreadable, malformed or not an Ed25519 key."""


class CanonicalError(ManifestError):
    """A value that canonical JSON cannot hold: a float, NaN, or a key that is not a string."""


class VerificationError(ManifestError):
    """A document failed a check. ``code`` is a short machine-readable name of the check."""

    code = "verification_failed"


class MalformedError(VerificationError):
    """Not JSON, not the expected shape or type, or larger than the size limit."""

    code = "malformed"


class SignatureError(VerificationError):
    """No signature by the trusted key id, or that signature does not verify."""

    code = "bad_signature"


class ExpiredError(VerificationError):
    """The document's ``expires`` is not after the reference time."""

    code = "expired"


class RollbackError(VerificationError):
    """The document's ``version`` is lower than the version this host last accepted."""

    code = "rollback"


class ForkError(VerificationError):
    """The document has the version this host last accepted but different signed bytes: two
    releases under one version, a sign of a compromised key or a forked release."""

    code = "forked"


class ValidityError(VerificationError):
    """The document's ``expires`` lies further ahead than the host's policy allows."""

    code = "validity_too_long"


class ClassMismatchError(VerificationError):
    """A per-class document names another class than the one it was read for."""

    code = "class_mismatch"


class LineMismatchError(VerificationError):
    """A document of another model line than the one this host resolves (``--model``), or than
    the one whose state was read for it."""

    code = "other_line"


class PointerMismatchError(VerificationError):
    """A per-class document whose version is not the one its directory's ``current`` names:
    a set and its pointer that disagree (a mixed or tampered directory)."""

    code = "pointer_mismatch"
