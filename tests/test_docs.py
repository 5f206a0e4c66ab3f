"""The documentation site (docs/, mkdocs.yml): every page in the nav exists, every page is in the nav, the
README's links into docs/ resolve, and `mkdocs build --strict` passes (a broken internal link, a missing
anchor or a page outside the nav fails it). mkdocs comes with the `docs` extra, which tests/run.sh installs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def nav_pages() -> list[str]:
    """The page paths mkdocs.yml's nav names (read as text: the `key: page.md` entries under `nav:`)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text.split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- (?:[^\n]*?: )?([\w./-]+\.md)\s*$", nav, re.M)


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    pages = nav_pages()
    assert len(pages) >= 20, pages  # the nav was read, not an empty match
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert missing == [], f"in mkdocs.yml's nav but not in docs/: {missing}"
    orphans = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert orphans == [], f"in docs/ but not in mkdocs.yml's nav: {orphans}"


def test_every_page_has_a_title_and_text() -> None:
    for page in nav_pages():
        text = (DOCS / page).read_text()
        assert text.startswith("# "), f"{page}: the first line is not a `# Title`"
        assert len(text.split()) > 50, f"{page}: fewer than 50 words"


def test_readme_links_into_the_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) > 10, links
    assert [link for link in links if not (ROOT / link).is_file()] == []
    # the README stays short: the text lives in docs/ (issue 31)
    assert len(readme.splitlines()) <= 250


def test_strict_build(tmp_path: Path) -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install '.[docs]'; CI has them)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "how-to" / "pbs" / "index.html").is_file()
