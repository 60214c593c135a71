"""The documentation: the MkDocs site (`mkdocs.yml`, `docs/`) builds in strict mode, so a link or anchor that
points at nothing fails the build; and every relative link and anchor of the README points at a file or
heading that exists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def headings(markdown: str) -> set[str]:
    """The anchors GitHub and MkDocs give a page's headings (fenced code left out)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    out = set()
    for h in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        h = re.sub(r"[`*]", "", h).strip().lower()
        out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", h)))
    return out


def test_the_docs_site_builds_with_every_link_and_anchor_resolved(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    built = {p.parent.relative_to(site).as_posix() for p in site.rglob("index.html")}
    assert {p.removesuffix("index").rstrip("/") or "." for p in pages} <= built | {"."}
    assert (site / "bench" / "results" / "e2e_h200_3l_p3.png").exists()  # the figures the pages show


def test_every_relative_link_in_the_readme_resolves():
    text = (ROOT / "README.md").read_text()
    own = headings(text)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 20
    broken = []
    for target in links:
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            ok = anchor in own
        else:
            ok = (ROOT / path).exists() and (not anchor or anchor in headings((ROOT / path).read_text()))
        if not ok:
            broken.append(target)
    assert broken == [], f"README links to nothing: {broken}"


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300  # depth goes to docs/


def test_benchmark_tables_equal_what_their_data_renders(capsys):
    """Every `<!-- rendered: NAME -->` table of docs/benchmarks is what bench/render.py makes of bench/results."""
    from bench.render import main

    assert main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def test_a_figure_typed_over_a_rendered_table_is_caught_and_an_unknown_table_named():
    from bench.render import BLOCK, PAGES, render_page

    page = (PAGES / "transport.md").read_text()
    block = BLOCK.search(page)
    assert block is not None and "271,496" in block["body"]
    edited = page.replace("271,496", "300,000")
    assert render_page(edited, "transport.md") == page != edited
    with pytest.raises(SystemExit, match="nosuch"):
        render_page("<!-- rendered: nosuch -->\n| a |\n<!-- /rendered -->", "x.md")


def test_a_one_gpu_row_shows_the_time_sharing_bound_only_where_the_learner_was_timed_alone():
    """A co-run's own train time is slower than the learner alone, so a bound made of it would flatter the loop."""
    import json

    from bench.render import RESULTS, _one_gpu

    both = json.loads((RESULTS / "e2e_h200pack_512.json").read_text())  # a time-shared run beside the co-run
    co_only = json.loads((RESULTS / "e2e_h200co_16.json").read_text())
    header, _, rows = _one_gpu([co_only, both])
    col = header.index("of time-share bound")
    by = {(r[0], r[1]): r[col] for r in rows}
    assert by[("16", "corun")] == "–"
    assert by[("512", "corun")] == "0.85 ×" and by[("512", "timeshare")] == "0.72 ×"
