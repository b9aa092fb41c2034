"""``manifest._batch.paused_gc``: the collector is off inside, restored after, and what the block
made is neither walked on the way out nor lost to collection."""

from __future__ import annotations

import gc
import weakref

import pytest

from manifest._batch import paused_gc


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_the_collector_is_off_inside_and_restored_after_also_on_error() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_nested_pause_leaves_the_outer_one_in_force() -> None:
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_the_block_made_moves_to_the_oldest_generation_without_a_young_collection() -> None:
    with paused_gc():
        made = [{"i": i} for i in range(50_000)]
        assert gc.get_count()[0] > 50_000
    # No young collection is left pending to walk the 50,000 dicts on the next allocation.
    assert gc.get_count()[0] < 1_000
    assert any(obj is made for obj in gc.get_objects(generation=2))


def test_cyclic_garbage_made_inside_is_still_collected() -> None:
    with paused_gc():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
    assert ref() is not None  # a cycle: reference counting alone does not free it
    gc.collect()
    assert ref() is None
