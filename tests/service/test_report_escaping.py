"""Every user-controlled string of the Markdown export stays inside its table cell or
line (a revision ``sha`` broke out of its cell). Rendered by a real CommonMark + GFM-table parser
(markdown-it-py), the export must keep its table shapes and show each hostile string as text."""

from __future__ import annotations

import re

import pytest
from test_report import _comparison

from kernelab.service.contract.schemas import RevisionInfo, RevisionsInfo, read_stored
from kernelab.service.judge import report

markdown_it = pytest.importorskip("markdown_it")

HOSTILE = "x|y`z`<b>bold</b> **sX** [l](http://e) &amp; ![i](http://e/i.png) #h ~~d~~\nnext | line"


def _render(md: str) -> str:
    return str(markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md))


def _with_revisions(**sides: str) -> str:
    c = _comparison(mode="pipes")
    # read as stored: a sha longer than the door's 64 characters, as an older version took it
    fields = dict(repo=sides.get("repo", HOSTILE), ref=HOSTILE, branch=HOSTILE, subdir=HOSTILE,
                  sha=sides.get("sha", HOSTILE), versions={"torch": HOSTILE})  # fmt: skip
    side = read_stored(RevisionInfo, fields)
    revisions = RevisionsInfo(baseline=side, candidate=side, diff_stat=f"a.py | 2 +-\n```\n{HOSTILE}",
                              diff_shortstat=HOSTILE)  # fmt: skip
    node = c.node.model_copy(update={"revisions": revisions, "hostname": HOSTILE})
    return report.to_markdown(c.model_copy(update={"node": node, "baseline_label": HOSTILE}))


def test_hostile_strings_in_every_revision_field_stay_in_their_cells() -> None:
    html = _render(_with_revisions())
    tables = re.findall(r"<table>.*?</table>", html, flags=re.S)
    assert len(tables) == 2  # the results table and the revisions table, nothing else
    for table in tables:
        widths = {
            len(re.findall(r"<t[dh][ >]", row)) for row in re.findall(r"<tr>.*?</tr>", table, flags=re.S)
        }
        assert len(widths) == 1, widths  # every row as wide as the header
    revisions = re.findall(r"<tr>.*?</tr>", tables[1], flags=re.S)
    assert len(revisions) == 3  # header, baseline, candidate
    assert "<td>x|y`z`&lt;b&gt;bol</td>" in revisions[1]  # the commit cell holds the whole sha[:12]
    outside_stat = html.split("<pre>")[0] + html.split("</pre>")[-1]
    for tag in ("<b>", "<strong>sX", "<a href", "<img", "<h1", "<del>"):
        assert tag not in outside_stat, tag  # no user markup became markup
    assert html.count("<pre>") == 1 and "</details>" in html.split("</pre>")[1]  # the diff stat's fence holds
    assert "`0123456789ab`" in _with_revisions(sha="0123456789abcdef0123")  # a plain sha: a code span
    assert "x|y`z`&lt;b&gt;bold&lt;/b&gt; **sX** [l](http://e) &amp;amp; ![i](http://e/i.png)" in html
