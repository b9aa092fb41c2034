"""What the measuring child feeds the model, and what of its answers it keeps for parity.

Owns the batches cut from the shared input pool (a batch size, the swept sizes of a workload's
``dims``, each input batched on its own axis), the state a recurrent model carries between steps
(``state_from``), the built-in post-processing (``argmax``, ``softmax``) and the outputs file the
parent's parity check reads (`qualify.measure.parity.unpack`). Builds no pool (the parent's
`qualify.measure.workload`), times nothing and compares nothing. numpy is imported where it is used.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from qualify.measure.failures import Failure, classify_exception
from qualify.measure.job import WorkerJob
from schemas.rules import batched_on, sample_at, swept_axes

__all__ = [
    "Recurrent",
    "answer_arrays",
    "at_dims",
    "batch",
    "identity",
    "pack",
    "postprocess",
    "recurrent",
    "save_parity_outputs",
]


def batch(pool: dict[str, Any], job: WorkerJob, start: int, size: int) -> dict[str, Any]:
    """``size`` samples from row ``start`` of the pool (rows on axis 0), each input batched on
    its own axis; an input fed whole takes the one sample at ``start``."""
    import numpy as np

    feed: dict[str, Any] = {}
    for name, array in pool.items():
        n = array.shape[0]
        spec = job.inputs[name]
        axis = batched_on(spec.get("batch_axis", 0), spec["source"], spec.get("state_from"))
        if axis is None:
            # A 0-d array for a scalar, not a number; copied (C order) when a swept axis was cut.
            whole = array[start % n, ...]
            feed[name] = whole if whole.flags.c_contiguous else whole.copy()
            continue
        idx = (np.arange(start, start + size) % n).astype(np.int64)
        rows = array[idx]
        feed[name] = np.ascontiguousarray(np.moveaxis(rows, 0, axis) if axis else rows)
    return feed


def at_dims(pool: dict[str, Any], job: WorkerJob, dims: dict[str, int]) -> dict[str, Any]:
    """The pool (built at each swept dimension's largest size) at the sizes ``dims`` gives:
    the leading part of every swept axis, as views; the pool itself when nothing is swept."""
    if not dims:
        return pool
    cut: dict[str, Any] = {}
    for name, array in pool.items():
        spec = job.inputs[name]
        axis = batched_on(spec.get("batch_axis", 0), spec["source"], spec.get("state_from"))
        shape = list(spec["shape"])
        sizes = sample_at(shape, axis, dims)
        swept = set(swept_axes(shape, axis))
        index = [slice(0, sizes[k]) if k in swept else slice(None) for k in range(len(sizes))]
        cut[name] = array[(slice(None), *index)]
    return cut


def postprocess(kind: str) -> Callable[[list[Any]], Any]:
    """The workload's built-in post-processing of the model's outputs (``argmax``, ``softmax``),
    timed with each inference; the outputs as they are for any other kind."""
    import numpy as np

    if kind == "argmax":
        return lambda outs: np.argmax(outs[0], axis=-1)
    if kind == "softmax":

        def softmax(outs: list[Any]) -> Any:
            x = outs[0] - np.max(outs[0], axis=-1, keepdims=True)
            e = np.exp(x)
            return e / e.sum(axis=-1, keepdims=True)

        return softmax
    return lambda outs: outs


class Recurrent:
    """A session whose ``state_from`` inputs take what the previous inference returned.

    Each thread carries its own state (a serving thread follows its own sequence), one per input
    and shape (batch sizes differ between configs); the first step of a sequence feeds the
    workload's own value of the input. Everything else is the wrapped session's.
    """

    def __init__(self, session: Any, links: dict[str, str]) -> None:
        outputs = [o.name for o in session.get_outputs()]
        missing = sorted(f"{n} <- {s}" for n, s in links.items() if s not in outputs)
        if missing:
            raise Failure(
                "load_failed",
                f"workload state_from names outputs this model lacks ({', '.join(missing)}); "
                f"its outputs are {outputs[:20]}",
            )
        self._session = session
        self._links = [(name, outputs.index(source)) for name, source in links.items()]
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def reset(self) -> None:
        """Start this thread's sequences again from the workload's values."""
        self._local.state = {}

    def run(self, names: Any, feed: dict[str, Any]) -> Any:
        state: dict[tuple[str, Any], Any] | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = {}
        shapes = {name: feed[name].shape for name, _ in self._links}
        feed = dict(feed)
        for name, _ in self._links:
            carried = state.get((name, shapes[name]))
            if carried is not None:
                feed[name] = carried
        outs = self._session.run(names, feed)
        for name, k in self._links:
            state[(name, shapes[name])] = outs[k]
        return outs


def recurrent(session: Any, job: WorkerJob) -> Any:
    links = {n: str(i["state_from"]) for n, i in job.inputs.items() if i.get("state_from")}
    return Recurrent(session, links) if links else session


def identity(value: Any) -> Any:
    return value


def answer_arrays(answer: Any) -> dict[str, Any]:
    """What a ``post`` hook answered, as arrays parity can compare: ``post`` for one value,
    ``post.<key>`` for each of a mapping's; numbers, booleans and strings (a string, or a list
    of them), nothing for an answer of another kind."""
    import numpy as np

    items = answer.items() if isinstance(answer, dict) else [(None, answer)]
    found: dict[str, Any] = {}
    for key, value in items:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError):  # ragged nested lists: not an answer parity can read
            continue
        if arr.dtype.kind in "biufUS":
            found["post" if key is None else f"post.{key}"] = arr
    return found


def pack(name: str, rows: list[Any]) -> dict[str, Any]:
    """One output's samples for the outputs file: stacked (sample axis first) when they share a
    shape and kind; else their values one after another and ``<name>#shapes`` (the layout
    `qualify.measure.parity.unpack` reads)."""
    import numpy as np

    shapes = {(r.shape, r.dtype.kind) for r in rows}
    if len(shapes) == 1:
        return {name: np.stack(rows)}
    rank = max(r.ndim for r in rows)
    table = np.full((len(rows), max(rank, 1)), -1, dtype=np.int64)
    for k, r in enumerate(rows):
        table[k, : r.ndim] = r.shape
    values = [r.reshape(-1) for r in rows]
    return {name: np.concatenate(values) if values else np.zeros(0), f"{name}#shapes": table}


def save_parity_outputs(
    session: Any,
    job: WorkerJob,
    model_feed: Callable[[int], dict[str, Any]],
    post: Callable[[Any], Any] | None,
) -> None:
    """The model's outputs (and, with a ``post`` hook, what it answers) on identical rows, one
    row at a time (works for fixed batch dims too), for the parent's parity check."""
    import numpy as np

    names = [o.name for o in session.get_outputs()]
    rows = job.parity_rows
    collected: dict[str, list[Any]] = {n: [] for n in names}
    builtin = postprocess(job.postprocess)
    try:
        for r in range(rows):
            outs = session.run(None, model_feed(r))
            for n, o in zip(names, outs, strict=True):
                # One sample's whole output: samples are stacked on a new first axis, so that
                # parity compares per sample whatever axis the output batches on ([T, N, C]).
                collected[n].append(np.asarray(o))
            if post is not None:  # what the service answers is compared too
                for key, arr in answer_arrays(post(builtin(outs))).items():
                    # An answer a sample lacks is empty, so the samples stay aligned.
                    have = collected.setdefault(key, [np.zeros(0)] * r)
                    have.extend([np.zeros(0)] * (r - len(have)))
                    have.append(arr)
    except Failure:
        raise
    except Exception as exc:
        raise Failure(classify_exception(exc, "run"), f"{type(exc).__name__}: {exc}") from exc
    packed: dict[str, Any] = {}
    for n, v in collected.items():
        v.extend([np.zeros(0)] * (rows - len(v)))
        packed.update(pack(n, v))
    np.savez(job.outputs_path, allow_pickle=False, **packed)
