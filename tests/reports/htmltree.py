"""A tiny DOM built with the standard library's html.parser, for structural checks of pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = ["Node", "parse"]

_VOID = {"meta", "br", "hr", "img", "input", "link", "col", "source", "wbr", "area", "base"}


@dataclass
class Node:
    """An element: tag, attributes, children and its own text."""

    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        """The class attribute as a set."""
        return set(self.attrs.get("class", "").split())

    def iter(self) -> list[Node]:
        """This node and every descendant, in document order."""
        found = [self]
        for child in self.children:
            found.extend(child.iter())
        return found

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        """Descendants (and self) with this tag and, if given, this class."""
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes)]

    def all_text(self) -> str:
        """The text of this node and its descendants, joined."""
        return "".join(t for n in self.iter() for t in n.text)


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text.append(data)


def parse(html: str) -> Node:
    """Parse a page into a tree of ``Node``."""
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
