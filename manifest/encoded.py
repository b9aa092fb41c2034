"""A manifest's entries held as their canonical JSON bytes (`EncodedEntries`): each entry encoded
once by ``envelope.encode_canonical`` when built, spliced as is when the manifest is signed,
written or split per class, and parsed on first read. Does not own the entry's layout
(``manifest.build``) nor the canonical form (``manifest.envelope``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from json.encoder import encode_basestring as quote
from typing import Any

from manifest.envelope import Encoded, RawJSON, canonical_parts
from manifest.errors import CanonicalError

__all__ = ["EncodedEntries", "EntryText", "holds_float", "plain_canonical"]

_PLAIN = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""``envelope.encode_canonical``'s ``json.dumps`` settings, made once (``json.dumps`` with
settings of its own makes an encoder per call)."""


def plain_canonical(value: Any) -> bytes:
    """``envelope.encode_canonical(value)`` of a value its maker knows to be plain: dicts with
    string keys, lists, strings, integers, booleans and nulls, no float and no `Encoded` value
    (the JSON dump of a model whose fields are such). Without the walk that looks for those,
    the part of encoding an entry that cost as much as the encoding
    (``tests/manifest/test_encoded.py`` holds the two equal on random plain values)."""
    return _PLAIN.encode(value).encode("utf-8")


def holds_float(value: Any) -> bool:
    """Whether a float hides anywhere in ``value``, a model's JSON dump (dicts, lists,
    scalars)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, float):
            return True
    return False


class EntryText(tuple[bytes, str, str]):
    """One entry's canonical bytes, with the two fields a publisher checks before anything is
    published (``signing.check_publishable``) read without parsing them:
    ``EntryText((data, host_class, decision))`` (a tuple: made once per class of a fleet)."""

    __slots__ = ()

    @property
    def data(self) -> bytes:
        return self[0]

    @property
    def host_class(self) -> str:
        return self[1]

    @property
    def decision(self) -> str:
        return self[2]


class EncodedEntries(Encoded, MutableMapping[str, Any]):
    """Class name -> entry, as `EntryText` until read (then the parsed object, kept).

    Iterates in the order the entries were given (the project's order); encodes, like any
    mapping, with sorted keys.
    """

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, EntryText]) -> None:
        self._items: dict[str, EntryText | Any] = dict(items)

    def __getitem__(self, name: str) -> Any:
        item = self._items[name]
        if type(item) is EntryText:
            item = self._items[name] = json.loads(item[0])
        return item

    def __setitem__(self, name: str, entry: Any) -> None:
        self._items[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"EncodedEntries({len(self._items)} entries)"

    def heads(self) -> Iterator[tuple[str, Any, Any]]:
        """``(name, entry's host_class, entry's decision)`` per entry, without parsing the ones
        still held as bytes (a publisher checks these of every entry)."""
        for name, item in self._items.items():
            if type(item) is EntryText:
                yield name, item[1], item[2]
            elif isinstance(item, dict):
                yield name, item.get("host_class"), item.get("decision")
            else:
                yield name, None, None

    def encoded(self, name: str) -> Any:
        """The entry of ``name`` as ``encode_canonical`` takes it without encoding again what
        is still bytes (a per-class document holds one entry)."""
        item = self._items[name]
        return RawJSON(item[0]) if type(item) is EntryText else item

    def canonical_parts(self) -> list[bytes]:
        items = self._items
        for name in items:
            if type(name) is not str:
                raise CanonicalError(f"$.entries: key {name!r} is not a string")
        parts = [b"{"]
        for name in sorted(items):
            item = items[name]
            parts += (quote(name).encode("utf-8"), b":")
            if type(item) is EntryText:
                parts.append(item[0])
            else:  # an entry that was read (and may have been changed since) or set
                parts += canonical_parts(item, f"$.entries.{name}")
            parts.append(b",")
        parts[-1] = b"}" if len(parts) > 1 else b"{}"
        return parts
