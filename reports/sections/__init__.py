"""The page's sections in page order, one module and one template each, listed in SECTIONS.

A new section adds its module (a ``build(inputs, classes)``), its template under
``templates/sections/`` and one entry here; the builder is untouched.
"""

from __future__ import annotations

from reports.inputs import Section
from reports.sections import classes, diff, lineage, matrix, releases, rollouts, tuning

__all__ = ["SECTIONS"]

SECTIONS: tuple[Section, ...] = (
    Section("matrix", "sections/matrix.html", matrix.build),
    Section("diff", "sections/diff.html", diff.build),
    Section("releases", "sections/releases.html", releases.build),
    Section("rollouts", "sections/rollouts.html", rollouts.build),
    Section("tuning", "sections/tuning.html", tuning.build),
    Section("lineage", "sections/lineage.html", lineage.build),
    Section("classes", "sections/classes.html", classes.build),
)
"""Every section of the page's main part, in page order."""
