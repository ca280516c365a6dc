"""Every notebook runs top to bottom (nbclient, tiny default settings); a failing cell fails."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory) -> dict[str, str]:
    """JUPYTER_PATH with a "python3" kernel that runs this interpreter, registered into a temp
    dir (the installed spec may say plain "python", whatever that is on PATH); registered once
    for all the notebooks (each `ipykernel install` is a subprocess)."""
    env = {}
    prefix = tmp_path_factory.mktemp("jupyter")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ipykernel",
            "install",
            "--prefix",
            str(prefix),
            "--name",
            "python3",
        ],
        check=True,
        capture_output=True,
    )
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    assert json.load(open(prefix / "share/jupyter/kernels/python3/kernel.json"))["argv"][0]
    return env


def _install_cell(path: str) -> str:
    nb = nbformat.read(path, as_version=4)
    return next(c for c in nb.cells if c.cell_type == "code").source


def _run_cell(cell: str, cwd, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs a cell's code in an interpreter that cannot see the editable install (-S skips
    site-packages' .pth files; jax & co. come back through PYTHONPATH)."""
    probe = "import importlib.util\nassert importlib.util.find_spec('orthros_jax') is None\n"
    return subprocess.run(
        [sys.executable, "-S", "-c", probe + cell], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_install_cell_installs_when_the_package_is_missing(tmp_path):
    """A fresh Colab runtime: the first cell pip-installs SOURCE and imports it. Here SOURCE is
    a wheel built from a copy of this checkout (a copy, so the build writes nothing into this
    one) and pip installs it into a private target directory."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), checkout / name)
    for name in ("orthros_jax", "notebooks"):
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(os.path.join(REPO, name), checkout / name, ignore=skip)
    wheels = tmp_path / "wheels"
    subprocess.run(
        # The venv's own setuptools builds it (an isolated build env would be installed first).
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(wheels), str(checkout)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("orthros_jax-*.whl")
    target = tmp_path / "site"
    target.mkdir()
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), *site_packages]),
        "PIP_TARGET": str(target),
        "PIP_NO_DEPS": "1",
        "ORTHROS_JAX_SOURCE": str(wheel),
    }
    cell = _install_cell(NOTEBOOKS[0])
    run = _run_cell(cell, tmp_path, env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"orthros_jax from {target / 'orthros_jax'}" in run.stdout
    assert (target / "orthros_jax" / "inference" / "drivers.py").is_file()

    # Without SOURCE, opened from a checkout's notebooks/: the cell installs that checkout (pip
    # is made to fail at once here; its error names what it was asked to install).
    env_checkout = {
        **env,
        "PYTHONPATH": os.pathsep.join(site_packages),  # not the target installed above
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "none"),
    }
    del env_checkout["ORTHROS_JAX_SOURCE"]
    run = _run_cell(cell, checkout / "notebooks", env_checkout)
    assert f"'pip', 'install', '-q', '{checkout}'" in run.stderr, run.stderr[-3000:]

    # Without SOURCE and outside a checkout: a clear error, no pip call.
    run = _run_cell(cell, tmp_path, env_checkout)
    assert run.returncode != 0 and "set SOURCE above" in run.stderr
    assert "pip" not in run.stderr.replace("set SOURCE above", "")


def test_notebooks_share_one_install_cell():
    assert len({_install_cell(p) for p in NOTEBOOKS}) == 1


def test_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == ["01_quickstart.ipynb", "02_convert_hf.ipynb", "03_long_context.ipynb"]


def _runnable(path: str) -> bool:
    """The HF notebook needs transformers and torch (optional extras)."""
    needs = ("transformers", "torch") if "convert_hf" in path else ()
    return all(importlib.util.find_spec(name) is not None for name in needs)


@pytest.mark.slow
def test_notebooks_run_top_to_bottom(tmp_path, monkeypatch, kernel_env):
    """The notebooks in one kernel, one after another (one kernel start and one import of jax,
    the package and torch instead of one per notebook): each starts in its own empty working
    directory, so it may not rely on the repository's files, and with a fresh namespace
    (%reset -f), so it may not rely on an earlier notebook's variables."""
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    # The notebooks' tempfile.mkdtemp dirs (Colab-style scratch) land in this test's tmp_path.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    client = NotebookClient(
        nbformat.v4.new_notebook(),
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    ran = []
    with client.setup_kernel():
        for path in filter(_runnable, NOTEBOOKS):
            nb = nbformat.read(path, as_version=4)
            code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
            assert "\nFULL = False" in "\n" + code and "/work/" not in code  # tiny, no local paths
            cwd = tmp_path / os.path.basename(path)
            cwd.mkdir()
            fresh = f"%reset -f\nimport os as _os\n_os.chdir({str(cwd)!r})\ndel _os"
            client.nb = nb
            client.reset_execution_trackers()
            client.execute_cell(nbformat.v4.new_code_cell(fresh), 0)
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)  # raises CellExecutionError naming the cell
            errors = [
                o
                for c in nb.cells
                if c.cell_type == "code"
                for o in c.get("outputs", [])
                if o.get("output_type") == "error"
            ]
            assert not errors, path
            assert os.listdir(cwd) == [], path  # wrote only into its temp dirs
            ran.append(path)
    assert ran  # the quickstart needs no extra
    assert any(scratch.iterdir())  # the kernel's temp dirs were here, not in the system's
