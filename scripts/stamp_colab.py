"""Stamp the repository URL from pyproject.toml into every notebook's Colab badge and setup cell.

The URL is set once in ``[project.urls] Repository``; typing it by hand into each notebook would
let the badges drift. ``--check`` reports stale notebooks without writing (used by the tests).

Usage: python scripts/stamp_colab.py [--check] [notebooks...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = ROOT / "notebooks"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_LINE = re.compile(
    r"^(\[!\[Open In Colab\]\(" + re.escape(BADGE_IMAGE) + r"\)\]\()([^)\s]*)(\))[ \t]*$", re.M
)
REPO_URL_LINE = re.compile(r'^(\s*REPO_URL\s*=\s*)"[^"\n]*"', re.M)
GITHUB_URL = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The GitHub URL in ``[project.urls] Repository``, the one place it is written."""
    with pyproject.open("rb") as file:
        urls = tomllib.load(file).get("project", {}).get("urls", {})
    url = urls.get("Repository")
    if not url or not GITHUB_URL.match(url):
        raise ValueError(
            f"{pyproject}: set [project.urls] Repository to https://github.com/<owner>/<repo>"
            f" (found {url!r})"
        )
    return url


def colab_url(repo_url: str, notebook_name: str) -> str:
    """Colab's address for a notebook on the repository's main branch."""
    owner, repo = GITHUB_URL.match(repo_url).groups()
    return f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/notebooks/{notebook_name}"


def stamp_notebook(notebook: nbformat.NotebookNode, name: str, repo_url: str) -> list[str]:
    """Stamp the badge and REPO_URL in place; return what is missing (empty when stamped)."""
    problems = []
    markdown = next((cell for cell in notebook.cells if cell.cell_type == "markdown"), None)
    if markdown is None or not BADGE_LINE.search(markdown.source):
        problems.append("no Colab badge line in the first markdown cell")
    else:
        url = colab_url(repo_url, name)
        markdown.source = BADGE_LINE.sub(lambda m: m.group(1) + url + m.group(3), markdown.source)
    setup = next((cell for cell in notebook.cells if cell.cell_type == "code"), None)
    if setup is None or not REPO_URL_LINE.search(setup.source):
        problems.append('no `REPO_URL = "..."` line in the first code cell (the setup cell)')
    else:
        setup.source = REPO_URL_LINE.sub(lambda m: f'{m.group(1)}"{repo_url}"', setup.source)
    return problems


def stamp_file(path: Path, repo_url: str, check: bool) -> list[str]:
    """Stamp one notebook file; in check mode only report. Returns the problems found."""
    original = path.read_text(encoding="utf-8")
    notebook = nbformat.reads(original, as_version=4)
    before = [cell.source for cell in notebook.cells]
    problems = stamp_notebook(notebook, path.name, repo_url)
    changed = before != [cell.source for cell in notebook.cells]
    if changed and check:
        problems.append("Colab URLs out of date: run python scripts/stamp_colab.py")
    elif changed:
        nbformat.write(notebook, path)
    return problems


def notebook_paths(given: list[str]) -> list[Path]:
    """The notebooks named, or every notebook in notebooks/."""
    return [Path(p) for p in given] if given else sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale notebooks, write none")
    parser.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    args = parser.parse_args(argv)
    repo_url = repository_url()
    failed = False
    for path in notebook_paths(args.notebooks):
        for problem in stamp_file(path, repo_url, args.check):
            print(f"{path}: {problem}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
