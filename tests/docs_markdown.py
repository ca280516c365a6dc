"""Reading the project's Markdown (README.md and docs/**/*.md) for the docs tests: fenced
blocks, inline code, links, heading anchors, the shell commands the pages quote and the absl
flags of the scripts they run (read from the source, without running it)."""

from __future__ import annotations

import ast
import functools
import glob
import os
import re
import shlex

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_DIRS = (
    "benchmarks/",
    "configs/",
    "docs/",
    "launch/",
    "notebooks/",
    "orthros_jax/",
    "results/",
    "tests/",
)
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# absl's own flags (absl.app / absl.logging) and the help flags app.run adds.
ABSL_FLAGS = set(
    "alsologtostderr log_dir logger_levels logtostderr only_check_args pdb pdb_post_mortem "
    "profile_file run_with_pdb run_with_profiling showprefixforinfo stderrthreshold "
    "use_cprofile_for_profiling v verbosity help helpfull helpshort helpxml flagfile "
    "undefok".split()
)
_FENCE = re.compile(r"^(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
_INLINE = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)  # not across paragraphs
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML_REF = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
_HTML_ID = re.compile(r"<a\s[^>]*?(?:id|name)=\"([^\"]+)\"", re.I)
_PYTHON = re.compile(r"(^|/)python(3(\.\d+)?)?$")


def doc_files() -> list[str]:
    """README.md and every page under docs/, as paths relative to the repository."""
    pages = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
    return ["README.md"] + sorted(os.path.relpath(p, REPO) for p in pages)


@functools.cache
def read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text outside fenced code blocks (each block replaced by an empty line)."""
    return _FENCE.sub("\n", text)


def inline_code(text: str) -> list[str]:
    """Every inline code span outside fenced blocks, whitespace runs collapsed (a span may
    wrap over lines)."""
    return [" ".join(m.group(2).split()) for m in _INLINE.finditer(prose(text))]


def link_targets(text: str) -> list[str]:
    """Targets of Markdown links and images, reference definitions and HTML href / src,
    outside code."""
    plain = _INLINE.sub("", prose(text))
    return _LINK.findall(plain) + _REF_DEF.findall(plain) + _HTML_REF.findall(plain)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets, emphasis and code marks
    dropped), lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page defines: its headings' slugs (repeats get -1, -2, ... as on GitHub)
    and explicit <a id=...> / <a name=...>."""
    seen: dict[str, int] = {}
    out = set(_HTML_ID.findall(prose(text)))
    for m in _HEADING.finditer(prose(text)):
        s = slug(m.group(2))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def _split_commands(line: str) -> list[list[str]]:
    """One shell line -> its simple commands' words (split at && || ; |, quotes respected)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for word in lex:
        if word in ("&&", "||", ";", "|", "&"):
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def shell_commands(text: str) -> list[list[str]]:
    """The words of every command in the page's shell blocks (continuations joined) and of
    every inline code span that runs a repository script (`python launch/x.py --flag`,
    `.venv/bin/python ...` or a bare `launch/x.py --flag`)."""
    out = []
    for lang, body in fenced_blocks(text):
        if lang in SHELL_LANGS:
            for line in body.replace("\\\n", " ").splitlines():
                out += _split_commands(line)
    for span in inline_code(text):
        try:
            words = shlex.split(span)
        except ValueError:
            continue
        if not words:
            continue
        if _PYTHON.search(words[0]) and len(words) > 1 and not words[1].startswith("-"):
            out.append(words)
        elif re.fullmatch(r"(launch|benchmarks)/\w+\.py", words[0]) and len(words) > 1:
            out.append(["python"] + words)
    return out


def python_call(words: list[str]) -> tuple[str, list[str]] | None:
    """(script or "-m module", argv after it) of a command that runs Python, else None."""
    for i, w in enumerate(words):
        if _PYTHON.search(w):
            rest = words[i + 1 :]
            if rest and rest[0] == "-m" and len(rest) > 1:
                return "-m " + rest[1], rest[2:]
            if rest and not rest[0].startswith("-"):
                return rest[0], rest[1:]
            return None
    return None


def repo_path_args(words: list[str]) -> list[str]:
    """Words (or --config= values) that name a path in this repository's folders."""
    out = []
    for w in words:
        value = w.split("=", 1)[1] if w.startswith("--config=") else w
        value = value.split(":", 1)[0].split("::", 1)[0]
        if value.startswith(TOP_DIRS) and not re.search(r"[*{<$]", value):
            out.append(value)
    return out


def module_exists(module: str) -> bool | None:
    """True / False for a module of this repository's packages; None for anything else."""
    path = os.path.join(REPO, *module.split("."))
    if not os.path.isdir(os.path.join(REPO, module.split(".")[0])):
        return None
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def _string_of(node: ast.AST, assigned: dict[str, ast.AST]) -> str | None:
    """A config default given as a literal or a module-level name joined from literals: the
    last `*.py` string in it, as a path under configs/."""
    if isinstance(node, ast.Name) and node.id in assigned:
        node = assigned[node.id]
    strings = [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".py")
    ]
    if not strings:
        return None
    return strings[-1] if "/" in strings[-1] else "configs/" + strings[-1]


@functools.cache
def script_flags(script: str) -> tuple[frozenset[str], str | None]:
    """(the flags a script defines, its --config default) read from its source: every
    `flags.DEFINE_*("name", ...)`, argparse's `add_argument("--name", ...)`,
    `cli.define_config_flag(default, ...)` ("config"),
    and the flags of the sibling or `benchmarks` modules it imports."""
    path = os.path.join(REPO, script)
    tree = ast.parse(read(script), script)
    assigned = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    names: set[str] = set()
    config_default = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            first = node.args[0] if node.args else None
            if fn.startswith("DEFINE_") and isinstance(first, ast.Constant):
                names.add(str(first.value))
            elif fn.startswith("DEFINE_") and "name" in {k.arg for k in node.keywords}:
                names.add(
                    next(
                        str(k.value.value)
                        for k in node.keywords
                        if k.arg == "name" and isinstance(k.value, ast.Constant)
                    )
                )
            elif fn == "add_argument" and isinstance(first, ast.Constant):  # argparse scripts
                hidden = any(  # help=argparse.SUPPRESS: internal, not listed by --help
                    k.arg == "help"
                    and isinstance(k.value, ast.Attribute)
                    and k.value.attr == "SUPPRESS"
                    for k in node.keywords
                )
                if str(first.value).startswith("--") and not hidden:
                    names.add(str(first.value)[2:])
            elif fn == "define_config_flag" and first is not None:
                names.add("config")
                config_default = _string_of(first, assigned)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for mod in _local_imports(node, os.path.dirname(path)):
                sub, _ = script_flags(os.path.relpath(mod, REPO))
                names |= sub
    return frozenset(names), config_default


def _local_imports(node: ast.Import | ast.ImportFrom, here: str) -> list[str]:
    """Files of the repository's own script modules an import statement loads: siblings of
    the script (launch/ puts its folder on the path) and benchmarks.* modules."""
    if isinstance(node, ast.Import):
        mods = [a.name for a in node.names]
    else:
        base = node.module or ""
        mods = [f"{base}.{a.name}" if base else a.name for a in node.names] + [base]
    out = []
    for m in mods:
        for candidate in (
            os.path.join(here, *m.split(".")) + ".py",
            os.path.join(REPO, *m.split(".")) + ".py",
        ):
            top = os.path.relpath(candidate, REPO).split(os.sep)[0]
            if top in ("launch", "benchmarks") and os.path.isfile(candidate):
                out.append(candidate)
                break
    return sorted(set(out))
