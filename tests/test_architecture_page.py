"""docs/explanation/architecture.md's table of test folders is checked against the tree (issue 39 step 5): every
folder of tests/ that holds test files has its row, and each row names exactly the test files of its folder
(those of its subfolders too), so the page cannot drift from the suite it describes."""

from __future__ import annotations

import re

from tests.helpers import ROOT

PAGE = ROOT / "docs" / "explanation" / "architecture.md"
ROW = re.compile(r"^\| `tests/([\w/]*)` \| (.*) \|$", re.M)


def table() -> dict[str, set[str]]:
    """folder (relative to tests/, "" for tests/ itself) -> the test file stems its row names."""
    rows = {folder.rstrip("/"): set(re.findall(r"`(test_\w+)`", text))
            for folder, text in ROW.findall(PAGE.read_text())}
    assert rows, f"no table of test folders in {PAGE}"
    return rows


def tree() -> dict[str, set[str]]:
    tests = ROOT / "tests"
    found: dict[str, set[str]] = {"": {p.stem for p in tests.glob("test_*.py")}}
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        stems = {p.stem for p in folder.rglob("test_*.py")}
        if stems:
            found[folder.name] = stems
    return found


def test_every_test_folder_has_its_row_and_every_row_names_its_files() -> None:
    rows, files = table(), tree()
    assert set(rows) == set(files), f"rows {sorted(rows)} != folders {sorted(files)}"
    wrong = {f"tests/{folder}": {"missing": sorted(files[folder] - rows[folder]),
                                 "not there": sorted(rows[folder] - files[folder])}
             for folder in files if rows[folder] != files[folder]}
    assert not wrong, f"{PAGE.relative_to(ROOT)}'s table of test folders is out of date: {wrong}"
