"""The offline HTML summary of `distlab grade`: what an instructor sees when nothing went wrong, and when
something did."""

from __future__ import annotations

from distlab.grading.engine import Row
from distlab.grading.report import html_summary


def test_a_class_where_nothing_went_wrong_says_so_instead_of_an_empty_table() -> None:
    page = html_summary([Row("alice", "03_async_sgd", "check_may_start", "pass"),
                         Row("bob", "03_async_sgd", "check_may_start", "not written")])
    assert "Nothing: every exercise handed in passed" in page
    assert "<th>message</th>" not in page


def test_a_failure_is_listed_with_its_message_and_the_kind_of_case() -> None:
    page = html_summary([Row("carol", "10_context_parallel", "check_merge", "fail", ["hidden"],
                             "p = 5: rank 0 <raised>")])
    assert "<th>message</th>" in page and "Nothing:" not in page
    assert "p = 5: rank 0 &lt;raised&gt;" in page and "<td>hidden</td>" in page
