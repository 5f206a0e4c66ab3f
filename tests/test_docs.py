"""The documentation site (docs/, mkdocs.yml): every page in the nav exists, every page is in the nav, the
README's links into docs/ resolve, and `mkdocs build --strict` passes (a broken internal link, a missing
anchor or a page outside the nav fails it). mkdocs comes with the `docs` extra, which tests/run.sh installs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_the_readmes_works_with_table_has_short_cells() -> None:
    # a row a line; the detail (costs, caveats, how it is tested) lives on docs/reference/works-with.md (issue 41)
    section = (ROOT / "README.md").read_text().split("\n## Works with\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 8, rows
    long = [cell for row in rows for cell in row.strip("| ").split(" | ") if len(cell) > 60]
    assert long == [], "a README Works-with cell over 60 characters: move its detail to docs/reference/works-with.md"


def test_one_figure_for_the_test_commands_time() -> None:
    # the README, getting started and the tests page said 18 and "20 or more" minutes at once (issue 41)
    figures = {(page, m) for page in ("README.md", "docs/getting-started.md", "docs/install.md",
                                      "docs/development/tests.md")
               for m in re.findall(r"about (\d+) minutes", (ROOT / page).read_text())}
    assert figures and len({m for _, m in figures}) == 1, sorted(figures)


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


# --- the reference written from the code (docs/hooks/reference.py --write; committed, checked here) --------------


def reference_hook() -> Any:
    """docs/hooks/reference.py as a module: the functions mkdocs runs, run here on their own."""
    spec = importlib.util.spec_from_file_location("slurmlaunch_docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_written_text() -> dict[str, str]:
    """README.md and every page of docs/, as written by hand (each generated part left out, its marker kept)."""
    hook = reference_hook()
    return {str(p.relative_to(ROOT)): hook.without_generated(p.read_text())
            for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]}


def test_the_committed_reference_is_what_the_code_produces_now() -> None:
    """The reference pages are committed (the README links them; a code host shows no MkDocs build), so a
    changed option, command, help line or docstring must be regenerated with them."""
    hook = reference_hook()
    pages = {str(p.relative_to(DOCS)) for p in hook.generated_pages()}
    assert {"reference/options.md", "reference/commands.md", "reference/python-api.md"} <= pages, pages
    for page in sorted(pages):
        text = (DOCS / page).read_text()
        assert hook.without_generated(text) != text, f"docs/{page}: a marker with nothing written below it"
        assert hook.render(text) == text, (f"docs/{page} differs from what the code produces now; regenerate the "
                                           f"reference pages: .venv/bin/{hook.COMMAND}")


def test_the_reference_generator_rewrites_only_its_parts(tmp_path: Path) -> None:
    """--write replaces what is between a marker and its end line, and keeps the text around it; --check says
    which page is stale, exit 1 (the real pages' freshness: the test above)."""
    hook = reference_hook()
    page = "# Commands\n\nbefore\n\n<!-- generated: commands -->\n\nold table\n\n<!-- end generated -->\n\nafter\n"
    once = hook.render(page)
    assert once.startswith("# Commands\n\nbefore\n\n<!-- generated: commands -->\n\n| command |"), once
    assert once.endswith("\n\n<!-- end generated -->\n\nafter\n") and "old table" not in once
    assert hook.render(once) == once
    assert hook.render(page.replace("\nold table\n\n<!-- end generated -->\n", "")) == once  # a new marker
    assert hook.without_generated(once) == "# Commands\n\nbefore\n\n<!-- generated: commands -->\n\nafter\n"
    r = subprocess.run([sys.executable, str(DOCS / "hooks" / "reference.py"), "--check"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "the generated reference pages are up to date\n"), r.stderr
    r = subprocess.run([sys.executable, str(DOCS / "hooks" / "reference.py")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "usage: python docs/hooks/reference.py --write | --check" in r.stderr


def code_spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text (fenced blocks left out: tests/test_docs_snippets.py)."""
    prose = re.sub(r"^([ \t]*)```.*?^\1```", "", text, flags=re.S | re.M)
    return [span.strip() for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose)]


def test_code_spans_reads_the_prose_between_blocks() -> None:
    """A blank line before a fence once made the fence pattern run from one block's opening to the next's,
    leaving the prose between them unread (and its flags unchecked)."""
    text = ("a `--x`\n\n```\n`--in`\n```\n\nb `--y`\n\n```\n`--in`\n```\n\nc `--w`\n\n  ```text\n  `--in`\n  ```\n"
            "\nd `--v`\n")
    assert code_spans(text) == ["--x", "--y", "--w", "--v"]


FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
LONG_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")

# Flags of other tools that the docs name on their own, in a code span: sbatch/srun, mpiexec (Open MPI, MPICH
# and PALS), apptainer, pyxis, rsync, git, squeue, pip, torchrun (the ones `run` refuses), the benchmarks.
OTHER_TOOLS = {
    "sbatch/srun": "--gres --ntasks --ntasks-per-node --kill-on-bad-exit --comment --wckey --distribution "
                   "--test-only --overlap --jobid --container-mounts --gpus-per-task --me --batch --cpu-only --error "
                   "--mail-type --begin --hold --gpus --output --export --mail-user --nodelist --dependency "
                   "--reservation",
    "mpiexec": "--hostfile --ppn --depth --cpu-bind --gpu-bind --pmi --hosts --mca --map-by --native",
    "apptainer": "--nv --bind --pwd",
    "rsync, git, pip": "--files-from --chmod --cached --others --exclude-standard --no-build-isolation",
    "torchrun": "--redirects --tee --local-ranks-filter --logs-specs --local-rank --local_rank --rdzv-conf --role "
                "--run-path --local-addr --event-log-handler --numa-binding --signals-to-handle --virtual-local-rank",
    "benchmarks and examples": "--quick --pairs --jobs --count-queries --also --only --cpu-per-job --epochs --lr --bs",
    # the batch step's plan (allocation/batch_step.py), written by the renderers, never typed by a user
    "slurmlaunch batch-step": "--warning --walltime --warn-before",
}


def slurmlaunch_options() -> dict[str, set[str]]:
    """Every option of every command, by command (launch's from its usage text)."""
    from slurmlaunch.allocation.launch import USAGE

    hook = reference_hook()
    options = {name: {o for a in hook.visible_options(parser) for o in a.option_strings}
               for name, (parser, _) in hook.subcommands().items()}
    flag_lines = re.findall(r"^  (-.*?)(?:  |$)", USAGE.split("\noptions:\n")[1].split("\nenvironment:")[0], re.M)
    options["launch"] = set(FLAG.findall(" ".join(flag_lines))) - {"-h", "--help"}
    return options


def test_the_options_reference_lists_every_option_of_every_command() -> None:
    hook = reference_hook()
    page = hook.render((DOCS / "reference" / "options.md").read_text())
    assert page.count("<!-- end generated -->") == 1 and "## `slurmlaunch submit`" in page  # the marker was filled
    sections = dict(re.findall(r"^## `slurmlaunch ([\w-]+)`\n(.*?)(?=^## |\Z)", page, re.S | re.M))
    options = slurmlaunch_options()
    assert {"submit", "run", "launch", "doctor", "stacks"} <= set(sections)
    for command, flags in options.items():
        if not flags:
            continue
        assert command in sections, f"options.md has no section for `slurmlaunch {command}`"
        shown = set(FLAG.findall(sections[command])) if command == "launch" else set(  # launch's: its --help text
            re.findall(r"`(-[^`]+)`", sections[command]))
        missing = sorted(flags - shown)
        assert missing == [], f"options.md's `slurmlaunch {command}` lacks {missing}"
    commands = hook.render((DOCS / "reference" / "commands.md").read_text())
    assert [c for c in options if f"| `{c}` |" not in commands] == []


def test_every_option_is_explained() -> None:
    """An option without a help line is explained on a page of its own subject (it is named in a code span
    there), or it is undocumented: the reference would show its name and nothing else."""
    hook = reference_hook()
    named = {FLAG.findall(span)[0] for text in hand_written_text().values() for span in code_spans(text)
             if FLAG.match(span)}
    unexplained = [f"{command} {a.option_strings[0]}" for command, (parser, _) in hook.subcommands().items()
                   for a in hook.visible_options(parser) if not a.help and not set(a.option_strings) & named]
    assert unexplained == [], "options with no help line that no page names (add a help= or explain them)"


def test_the_options_the_docs_name_exist() -> None:
    """A flag in a code span of README or docs/ is an option of slurmlaunch (of the command the span names,
    when it starts with `slurmlaunch COMMAND`), or one of another tool's that OTHER_TOOLS lists."""
    options = slurmlaunch_options()
    ours = set().union(*options.values(), {"--help"})
    others = {flag for flags in OTHER_TOOLS.values() for flag in flags.split()}
    unknown = []
    for page, text in hand_written_text().items():
        for span in code_spans(text):
            words = span.split()
            if words[:1] == ["slurmlaunch"] and len(words) > 1 and words[1] in options:
                flags = {f.split("=")[0] for f in FLAG.findall(" ".join(words[2:]).split(" SCRIPT")[0])}
                if words[1] == "submit" and len(words) > 2 and not words[2].startswith("-"):
                    flags = set()  # `slurmlaunch submit train.py --lr 0.1`: the script's own flags
                unknown += [(page, span, f) for f in flags - options[words[1]] - {"-h", "--help"}
                            if not f.endswith("-")]
            elif LONG_FLAG.match(span):  # a short one alone (`-l`, `-P`) is as often qsub's or srun's as ours
                flag = LONG_FLAG.findall(span)[0]
                if flag not in ours and flag not in others and not flag.endswith("-"):
                    unknown.append((page, span, flag))
    assert unknown == [], "flags the docs name that no command has (a typo, a removed option, or OTHER_TOOLS)"


def test_the_python_api_reference_has_every_public_name_and_its_docstring() -> None:
    import inspect

    import slurmlaunch

    page = reference_hook().render((DOCS / "reference" / "python-api.md").read_text())
    for name in slurmlaunch.__all__:
        assert f"### `{name}`" in page, name
        if name != "__version__":
            doc = inspect.getdoc(getattr(slurmlaunch, name))
            assert doc, f"slurmlaunch.{name} has no docstring: the reference would say nothing"
            first_word = doc.split()[0].strip("`")
            assert first_word in page, (name, first_word)
