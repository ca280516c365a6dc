"""The commands the docs quote, as written: in README.md and docs/**/*.md, every command in a
shell block (and every inline `python launch/...` command) runs a script or module that exists
with flags it defines (read from its source, no run), every repository path it names exists,
every `--config.<key>` override names a key of the config, and every `launch/train.py` command
builds a valid training config (file + overrides, no training). Runs in seconds (no compile);
CI runs the set-up commands themselves."""

from __future__ import annotations

import ast
import os
import re

import pytest
from docs_markdown import (
    ABSL_FLAGS,
    REPO,
    doc_files,
    module_exists,
    python_call,
    read,
    repo_path_args,
    script_flags,
    shell_commands,
)
from training_helpers import run_launchers

from orthros_jax.config import cli
from orthros_jax.training import TrainConfig

# launch/compile.py spells --config.mesh.X as --mesh.X (it rewrites argv before absl parses it).
MESH_ALIAS = {"launch/compile.py"}


def doc_commands() -> list[tuple[str, list[str]]]:
    """(page, words) of every command the docs quote."""
    return [(page, words) for page in doc_files() for words in shell_commands(read(page))]


def script_commands() -> list[tuple[str, str, list[str]]]:
    """(page, script, argv after it) of every command that runs a launch/ or benchmarks/ script."""
    out = []
    for page, words in doc_commands():
        call = python_call(words)
        if call and re.fullmatch(r"(launch|benchmarks)/\w+\.py", call[0]):
            script, argv = call
            if script in MESH_ALIAS:
                argv = [a.replace("--mesh.", "--config.mesh.", 1) for a in argv]
            out.append((page, script, argv))
    return out


def _id(case) -> str:
    return f"{case[0]}: {case[1]} {' '.join(case[2])}"[:150]


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def test_docs_have_the_commands_this_checks():
    scripts = {s for _, s, _ in script_commands()}
    assert {
        "launch/train.py",
        "launch/convert.py",
        "launch/generate.py",
        "launch/serve.py",
        "launch/benchmark.py",
        "launch/compile.py",
        "launch/evaluate.py",
        "launch/experiments.py",
        "launch/mqar.py",
        "benchmarks/serve_load.py",
    } <= scripts


@pytest.mark.parametrize("page", doc_files())
def test_commands_name_real_files(page):
    bad = []
    for words in shell_commands(read(page)):
        call = python_call(words)
        if call and call[0].startswith("-m "):
            if module_exists(call[0][3:]) is False:
                bad.append(f"no module {call[0][3:]}")
        elif call and not os.path.isfile(os.path.join(REPO, call[0])):
            bad.append(f"no script {call[0]}")
        if re.fullmatch(r"[\w.-]+/[\w/.-]+", words[0]) and not words[0].startswith(".venv/"):
            if not call and not os.path.isfile(os.path.join(REPO, words[0])):
                bad.append(f"no program {words[0]}")
        bad += [
            f"no file {p}"
            for p in repo_path_args(words)
            if not os.path.exists(os.path.join(REPO, p))
        ]
    assert not bad, f"{page}: " + "; ".join(bad)


@pytest.mark.parametrize("case", script_commands(), ids=_id)
def test_commands_use_real_flags(case):
    page, script, argv = case
    assert os.path.isfile(os.path.join(REPO, script)), f"{page}: no script {script}"
    defined, _ = script_flags(script)
    for arg in argv:
        if arg.startswith("--") and not arg.startswith("--config."):
            name = arg[2:].split("=", 1)[0]
            name = name[2:] if name.startswith("no") and name[2:] in defined else name
            assert name in defined | ABSL_FLAGS, f"{page}: {script} has no --{name}"


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in script_commands()
        if c[1] != "launch/train.py" and any(a.startswith("--config.") for a in c[2])
    ],
    ids=_id,
)
def test_config_overrides_name_real_keys(case, monkeypatch):
    page, script, argv = case
    _, default = script_flags(script)
    assert default and os.path.isfile(os.path.join(REPO, default)), (
        f"{script}: no --config default found"
    )
    monkeypatch.chdir(REPO)
    cli.check_override_keys(argv, default=default)  # a ValueError names the unknown key


@pytest.mark.parametrize(
    "case", [c for c in script_commands() if c[1] == "launch/train.py"], ids=_id
)
def test_training_commands_build_valid_configs(case, monkeypatch):
    page, _, argv = case
    monkeypatch.chdir(REPO)
    spec = next(
        (a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "configs/tiny_pt.py"
    )
    path, _, arg = spec.partition(":")
    if arg and not os.path.exists(arg):
        pytest.skip(f"{spec}: its argument is a directory an earlier command makes")
    made = [a for a in argv if a.startswith("--config.data.") and "/" in a]
    for a in made:  # e.g. a prepared dataset or tokenizer an earlier command writes
        paths = re.findall(r"[\w./-]+/[\w./-]+", a.split("=", 1)[1])
        if any(not os.path.exists(p) for p in paths):
            pytest.skip(f"{a}: names a path an earlier command makes")
    config = cli.load_config_file(spec)
    cli.check_override_keys(argv, default=spec)
    with config.unlocked():
        for key, value in (
            a[len("--config.") :].split("=", 1) for a in argv if a.startswith("--config.")
        ):
            node = config
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = _value(value)
    TrainConfig.from_config(config)  # a ValueError here is a documented command that fails


def _helpfull_flags(scripts: list[str], tmp_path) -> dict[str, set[str]]:
    """The flags each script lists: absl's --helpfull, or --help for an argparse script. One
    subprocess imports jax and the package once and runs each script in a forked child
    (training_helpers.run_launchers), so every script defines its flags in a fresh copy."""
    runs = run_launchers([[s, "--helpfull"] for s in scripts], tmp_path / "full")
    again = [s for s, r in zip(scripts, runs, strict=True) if r.returncode != 0]
    helps = run_launchers([[s, "--help"] for s in again], tmp_path / "help") if again else []
    helped = dict(zip(again, helps, strict=True))
    flag = re.compile(r"^\s+--(?:\[no\])?([a-z0-9_]+)", re.M)
    texts = {s: helped.get(s, r).stdout for s, r in zip(scripts, runs, strict=True)}
    return {s: set(flag.findall(t)) for s, t in texts.items()}


@pytest.mark.slow  # every script's --helpfull, jax imported once (run_launchers)
def test_flags_read_from_the_source_are_the_scripts_flags(tmp_path):
    scripts = sorted({s for _, s, _ in script_commands()})
    listed = _helpfull_flags(scripts, tmp_path)
    for script in scripts:
        defined, _ = script_flags(script)
        missing = defined - listed[script]
        assert not missing, f"{script} --helpfull does not list {sorted(missing)}"
