"""A ``workload.pipeline`` hook (``pre`` or ``post``), imported and called in the measuring child.

Owns importing the project's hook function beside the model, refusing a module of the standard
library, and turning anything the hook raises into ``hook_failed`` with the line of the hook's own
code that raised. Does not time the hook (`qualify.measure.timing` does) nor contain what it starts
(`qualify.measure.contain`).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qualify.measure.failures import Failure

__all__ = ["Hook"]


class Hook:
    """A ``workload.pipeline`` hook imported in this process. Calling it turns anything it
    raises into ``hook_failed``, naming the hook and the line of its own code that raised."""

    def __init__(self, stage: str, spec: str, root: str) -> None:
        import importlib

        self.stage, self.spec = stage, spec
        module_name, _, name = spec.partition(":")
        if module_name.partition(".")[0] in sys.stdlib_module_names:
            raise Failure(
                "hook_failed",
                f"workload.pipeline.{stage} {spec}: {module_name!r} is a module of Python's "
                "standard library, not a hook of the project's",
            )
        if root not in sys.path:
            sys.path.insert(0, root)
        try:
            module = importlib.import_module(module_name)
            self.fn: Callable[[Any], Any] = getattr(module, name)
        except Exception as exc:
            raise Failure("hook_failed", self._said(exc, "could not be imported")) from exc
        if not callable(self.fn):
            raise Failure("hook_failed", f"workload.pipeline.{stage} {spec}: not a function")
        self.file = str(getattr(module, "__file__", "") or "")

    def __call__(self, value: Any) -> Any:
        try:
            return self.fn(value)
        except Exception as exc:
            raise Failure("hook_failed", self._said(exc, "raised")) from exc

    def _said(self, exc: BaseException, what: str) -> str:
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if getattr(self, "file", None) and f.filename == self.file]
        at = own[-1] if own else frames[-1] if frames else None
        where = f" at {Path(at.filename).name}:{at.lineno}" if at is not None else ""
        return (
            f"workload.pipeline.{self.stage} {self.spec} {what}{where}: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        )
