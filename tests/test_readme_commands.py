"""The README's commands as written: every `launch/train.py` command in a bash block builds a
valid training config (file + overrides, no training), and every flag of every launcher
command exists. Runs in seconds (no compile); CI runs the set-up commands themselves."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest

from orthros_jax import configlib
from orthros_jax.training import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands() -> list[list[str]]:
    """argv (without the interpreter) of every `.venv/bin/python launch/...` command in a
    ```bash block, line continuations joined, `&&` chains split."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if (
                    len(words) > 1
                    and words[0].endswith("python")
                    and words[1].startswith("launch/")
                ):
                    out.append(words[1:])
    return out


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def test_readme_has_the_commands_this_checks():
    scripts = {c[0] for c in readme_commands()}
    assert {"launch/train.py", "launch/convert.py", "launch/generate.py"} <= scripts


@pytest.mark.parametrize(
    "argv", [c for c in readme_commands() if c[0] == "launch/train.py"], ids=" ".join
)
def test_readme_training_commands_build_valid_configs(argv):
    spec = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
    if ":" in spec and not os.path.exists(os.path.join(REPO, spec.split(":", 1)[1])):
        pytest.skip(f"{spec}: its argument is a directory an earlier README command makes")
    config = configlib.load_config_file(os.path.join(REPO, spec.split(":")[0]) +
                                        (":" + spec.split(":", 1)[1] if ":" in spec else ""))  # fmt: skip
    overrides = [a[len("--config.") :].split("=", 1) for a in argv if a.startswith("--config.")]
    configlib.check_override_keys(argv, default=None)
    with config.unlocked():
        for key, value in overrides:
            node = config
            *path, leaf = key.split(".")
            for p in path:
                node = node[p]
            node[leaf] = _value(value)
    TrainConfig.from_config(config)  # a ValueError here is a README command that fails


def _flags_of(script: str) -> set[str]:
    done = subprocess.run([sys.executable, script, "--helpfull"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    return set(re.findall(r"^\s+--(?:\[no\])?([a-z_]+)", done.stdout, re.M))


@pytest.mark.slow  # one --helpfull per launcher (imports jax each)
def test_readme_commands_use_existing_flags():
    known: dict[str, set[str]] = {}
    for argv in readme_commands():
        flags = known.setdefault(argv[0], _flags_of(argv[0]))
        for arg in argv[1:]:
            if arg.startswith("--") and not arg.startswith("--config."):
                name = arg[2:].split("=", 1)[0]
                name = name[2:] if name.startswith("no") and name[2:] in flags else name
                assert name in flags, f"README: {' '.join(argv)}: {argv[0]} has no --{name}"
