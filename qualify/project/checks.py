"""The checks a project needs beyond its model's rules.

Owns checking what a validated project refers to (artifact and recorded input files, the
artifact each ``derived_from`` names, each pipeline hook's module and function: its source
parsed, never run) and that the workload and parity tolerances fit every artifact's graph. Does
not read or validate the project file (``qualify.project.load``) nor word where a problem is
(``qualify.project.problems``).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from qualify.errors import ArtifactError
from qualify.project.graph import ModelSignature, TensorSignature, read_signature
from qualify.project.loaded import LoadedProject
from qualify.project.problems import Document, Loc, Problem, show
from schemas.atomic import kind_of, open_binary, read_bounded
from schemas.project import ArtifactSpec, InputSpec, Project, Workload

__all__ = ["hook_problem", "hook_source", "model_problems", "reference_problems"]

_NPY_MAGIC = b"\x93NUMPY"

MAX_HOOK_SOURCE_BYTES = 4 * 1024 * 1024
"""The largest hook module source the load check parses."""


def reference_problems(loaded: LoadedProject, doc: Document) -> list[Problem]:
    """What the project refers to and cannot be found: an artifact or recorded input file, the
    artifact a ``derived_from`` names, a pipeline hook's module or function."""
    project = loaded.project
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
    return problems


def _check_file(
    loaded: LoadedProject, doc: Document, loc: Loc, relpath: str, *, npy: bool
) -> Problem | None:
    target = loaded.resolve(relpath)
    mark = doc.mark_for(loc)
    relative = f"; relative paths are resolved against {loaded.root}"
    if not target.exists():
        return Problem(loc, f"file not found: {target}", f"correct the path{relative}", mark)
    if not target.is_file():
        kind = kind_of(target.stat().st_mode)
        return Problem(loc, f"not a file: {target} is {kind}", "point it at a regular file", mark)
    try:
        with open_binary(target) as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError as exc:
        return Problem(
            loc, f"cannot read {target}: {exc.strerror or exc}", "fix its permissions", mark
        )
    if npy and head != _NPY_MAGIC:
        return Problem(
            loc,
            f"not a .npy file: {target} does not start with the NumPy magic bytes",
            "save the samples with numpy.save(path, array)",
            mark,
        )
    return None


def _check_hooks(loaded: LoadedProject, doc: Document) -> list[Problem]:
    """Every ``workload.pipeline`` hook names a module that exists (beside the project file, or
    installed) and a function it defines. Checked without running the user's code: the module's
    source is parsed, never imported, in this process."""
    pipeline = loaded.project.workload.pipeline
    found: list[Problem] = []
    for stage in ("pre", "post"):
        hook = getattr(pipeline, stage) if pipeline is not None else None
        if hook is None:
            continue
        loc: Loc = ("workload", "pipeline", stage)
        why = hook_problem(loaded.root, hook)
        if why is not None:
            message, fix = why
            found.append(Problem(loc, message, fix, doc.mark_for(loc)))
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


def _check_lineage(project: Project, doc: Document) -> list[Problem]:
    """``derived_from`` must name the baseline or another artifact, never itself."""
    labels = [project.artifacts.baseline.label, *(c.label for c in project.artifacts.candidates)]
    found: list[Problem] = []
    for i, spec in enumerate(project.artifacts.candidates):
        parent = spec.derived_from
        if parent is None or parent == "baseline" or (parent in labels and parent != spec.label):
            continue
        loc: Loc = ("artifacts", "candidates", i, "derived_from")
        close = difflib.get_close_matches(parent, ["baseline", *labels], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        what = "names the artifact itself" if parent == spec.label else "names no artifact"
        found.append(
            Problem(
                loc,
                f"{show(parent)} {what}",
                f"{hint}use 'baseline' or one of the artifact names {labels}",
                doc.mark_for(loc),
            )
        )
    return found


def model_problems(loaded: LoadedProject, doc: Document) -> list[Problem]:
    """Every artifact is an ONNX model that takes the workload's inputs and whose outputs the
    tolerances can apply to."""
    project = loaded.project
    specs: list[tuple[str | int, ArtifactSpec]] = [("baseline", project.artifacts.baseline)]
    specs += [(i, spec) for i, spec in enumerate(project.artifacts.candidates)]
    problems: list[Problem] = []
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
                Problem(
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


def _unknown_name(doc: Document, loc: Loc, what: str, name: str, known: list[str]) -> Problem:
    """A name the model does not have, marked on its key, with 'rename it to' the closest."""
    close = difflib.get_close_matches(name, known, n=1)
    fix = f"rename it to {close[0]!r}" if close else "use the model's names listed"
    return Problem(loc, what, fix, doc.mark_for(loc, on_key=True))


def _listing(sigs: Sequence[TensorSignature]) -> str:
    return "; ".join(s.describe() for s in sigs) or "none"


def _workload_problems(
    workload: Workload, label: str, sig: ModelSignature, doc: Document
) -> list[Problem]:
    found: list[Problem] = []
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
                Problem(
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
                Problem(
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
    doc: Document,
) -> list[Problem]:
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
            Problem(
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
    doc: Document,
) -> list[Problem]:
    dims = model_input.shape
    if dims is None:
        return []
    at: Loc = ("workload", "inputs", name, "shape")
    theirs = f"input {name!r} of {label} is {model_input.describe()}"
    if len(dims) != len(spec.shape):
        return [
            Problem(
                at,
                f"{spec.shape} has rank {len(spec.shape)}, but {theirs} (rank {len(dims)})",
                "give one size per model dimension, the batch axis included (at batch_axis)",
                doc.mark_for(at),
            )
        ]
    found: list[Problem] = []
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
                Problem(
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
                Problem(
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


def _tolerance_problems(project: Project, baseline: ModelSignature, doc: Document) -> list[Problem]:
    found: list[Problem] = []
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
                    Problem(
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
                Problem(
                    at,
                    "cannot apply to any output of the baseline: "
                    + "; ".join(f"{s.describe()} ({_top1_unfit(s)})" for s in baseline.outputs),
                    "remove it; max_abs, max_rel and cosine_min apply to every output",
                    doc.mark_for(at),
                )
            )
    return found
