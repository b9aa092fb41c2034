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


def test_a_section_the_page_does_not_have_goes_at_its_end_and_a_failure_is_said_in_place() -> None:
    new = Section("energy", "## Energy\n\n| j |\n", True, 1.0)
    page = splice_sections(PAGE, [new], note="n")
    assert page.startswith(PAGE.rstrip("\n"))
    assert page.endswith("## Energy\n\n| j |\n\nn\n")
    failed = Section("resolve", "bench/resolve.py failed: boom", False, 1.0)
    page = splice_sections(PAGE, [failed], note="n")
    assert "| resolve | 3.58x |" not in page
    assert "## bench/resolve.py\n\nbench/resolve.py failed: boom\n\nn\n" in page
    assert "| old | 64.0 MB |" in page
