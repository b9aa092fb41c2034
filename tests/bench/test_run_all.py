"""`make bench`'s page: running one benchmark alone keeps the others' numbers."""

from __future__ import annotations

from bench.run_all import Section, splice_sections

PAGE = """# Benchmarks

## Machine

| date (UTC) | then |

## Worker peak memory

| old | 64.0 MB |

## bench/resolve.py

| resolve | 3.58x |
"""


def test_a_benchmark_run_alone_replaces_only_its_own_section() -> None:
    fresh = Section("memory", "## Worker peak memory\n\n| new | 61.4 MB |\n", True, 40.0)
    page = splice_sections(PAGE, [fresh], note="_Rerun alone._")
    assert page is not None
    assert "61.4 MB" in page and "64.0 MB" not in page
    assert "| resolve | 3.58x |" in page and "| date (UTC) | then |" in page
    assert page.index("_Rerun alone._") < page.index("## bench/resolve.py")
    # Rerunning it again replaces the note as well, it does not pile up.
    again = splice_sections(page, [fresh], note="_Rerun alone._")
    assert again == page


def test_a_section_the_page_does_not_have_asks_for_the_whole_page() -> None:
    new = Section("energy", "## Energy\n\n| j |\n", True, 1.0)
    assert splice_sections(PAGE, [new], note="n") is None
    failed = Section("memory", "bench/memory.py failed: boom", False, 1.0)
    assert splice_sections(PAGE, [failed], note="n") is None
