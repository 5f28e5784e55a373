"""The part of the instructors' page (`book/instructors.md`) that the registry writes: what the hidden
cases of each exercise cover. The book's extension (`tools/distlab_book.py`) puts it where the page has
the `MARKER` line, in the instructor edition only; the public edition says where to find it instead, so
the hidden cases stay off the public site. Generated at every build, it cannot go stale."""

from __future__ import annotations

from distlab.grading import registry
from distlab.grading.hidden_cases import HIDDEN

MARKER = "<!-- the hidden cases of every exercise (distlab.grading.instructors_page) -->"
PUBLIC = ("The instructor edition of this page (`make book-instructor`) lists what the hidden cases of "
          "each exercise cover; the public site does not.")


def hidden_cases_table() -> str:
    """A Markdown table: each exercise (lab, check) and what its hidden cases cover."""
    rows = [f"| {e.lab[:2]} | `{e.check}` | {HIDDEN[e.check].covers} |" for e in registry.exercises()]
    return "\n".join(["| lab | check | hidden cases |", "| --- | --- | --- |", *rows])


def expand(text: str, edition: str) -> str:
    """`text` (the page's Markdown) with the marker line replaced for `edition` ("public" or
    "instructor")."""
    return text.replace(MARKER, hidden_cases_table() if edition == "instructor" else PUBLIC)
