"""The docs' references are real: every relative link and image in README.md and docs/**/*.md
names a file of this repository (and, into a Markdown page, one of its headings), and every
repository path quoted as inline code exists, so a moved or renamed module shows up here."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from docs_markdown import REPO, TOP_DIRS, anchors, doc_files, inline_code, link_targets, read


def _repo_files() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_the_pages_are_found():
    pages = doc_files()
    assert "README.md" in pages and "docs/training.md" in pages and len(pages) > 10


@pytest.mark.parametrize("page", doc_files())
def test_relative_links_name_files_and_headings(page):
    bad = []
    for target in link_targets(read(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(REPO, file)):
            bad.append(f"{target}: no file {file}")
        elif anchor and file.endswith(".md") and anchor not in anchors(read(file)):
            bad.append(f"{target}: {file} has no heading with anchor #{anchor}")
    assert not bad, f"{page}: " + "; ".join(bad)


def _path_exists(path: str, files: list[str]) -> bool:
    """A path under a top folder that exists, or `module.attribute` of one; a bare
    `x/y.py` (no top folder) matches the end of a file's path."""
    path = path.split("::", 1)[0].split(":", 1)[0]
    if os.path.exists(os.path.join(REPO, path)):
        return True
    if path.startswith(TOP_DIRS):
        module, _, attr = path.rpartition(".")
        return bool(attr) and "/" not in attr and os.path.isfile(os.path.join(REPO, module + ".py"))
    return any(f == path or f.endswith("/" + path) for f in files)


@pytest.mark.parametrize("page", doc_files())
def test_quoted_repository_paths_exist(page):
    files = _repo_files()
    quoted = {span for span in inline_code(read(page)) if " " not in span}
    paths = {
        q for q in quoted if q.startswith(TOP_DIRS) or re.fullmatch(r"[\w/]*\w+\.(py|sh|ipynb)", q)
    }
    paths = {p for p in paths if not re.search(r"[*{}<>$]", p)}
    missing = sorted(p for p in paths if not _path_exists(p, files))
    assert not missing, f"{page} quotes paths that do not exist: {missing}"


def test_anchor_rule_matches_github():
    from docs_markdown import slug

    assert (
        slug("TPU and GPU: splash and cuDNN attention") == "tpu-and-gpu-splash-and-cudnn-attention"
    )
    assert slug("`orthros_jax/layers/` and **kinds**") == "orthros_jaxlayers-and-kinds"
    assert (
        slug("Table 4 through the server (two requests)")
        == "table-4-through-the-server-two-requests"
    )
    assert anchors("# A\n\n## A\n```bash\n# not a heading\n```\n") == {"a", "a-1"}
