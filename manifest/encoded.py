"""A manifest's entries held as their canonical JSON text.

Owns `EncodedEntries`: what ``manifest.build`` returns as a manifest's ``entries``, each entry's
canonical text written once from the policy's decisions. Encoding (``envelope.encode_canonical``)
splices those texts instead of building a dict per class and encoding it again; everyone else
reads the entries as the JSON objects they are (parsed on first read, then kept, so a change made
to one is what gets encoded). Does not own the entry's layout (``manifest.build``) nor the
canonical form (``manifest.envelope``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from json.encoder import encode_basestring as quote
from typing import Any

from manifest.envelope import Encoded, RawJSON, canonical_text
from manifest.errors import CanonicalError

__all__ = ["EncodedEntries", "EntryText"]


class EntryText:
    """One entry's canonical text, with the two fields a publisher checks before anything is
    published (``signing.check_publishable``) read without parsing it."""

    __slots__ = ("decision", "host_class", "text")

    def __init__(self, text: str, host_class: str, decision: str) -> None:
        self.text = text
        self.host_class = host_class
        self.decision = decision


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
            item = self._items[name] = json.loads(item.text)
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
        still held as text (a publisher checks these of every entry)."""
        for name, item in self._items.items():
            if type(item) is EntryText:
                yield name, item.host_class, item.decision
            elif isinstance(item, dict):
                yield name, item.get("host_class"), item.get("decision")
            else:
                yield name, None, None

    def encoded(self, name: str) -> Any:
        """The entry of ``name`` as ``encode_canonical`` takes it without encoding again what
        is still text (a per-class document holds one entry)."""
        item = self._items[name]
        return RawJSON(item.text) if type(item) is EntryText else item

    def canonical_text(self) -> str:
        items = self._items
        for name in items:
            if type(name) is not str:
                raise CanonicalError(f"$.entries: key {name!r} is not a string")
        members = []
        for name in sorted(items):
            item = items[name]
            text = (
                item.text
                if type(item) is EntryText
                # an entry that was read (and may have been changed since) or set
                else canonical_text(item, f"$.entries.{name}")
            )
            members.append(f"{quote(name)}:{text}")
        return "{" + ",".join(members) + "}"
