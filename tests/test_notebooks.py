"""Every notebook runs top to bottom (nbclient, tiny default settings); a failing cell fails."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))


def _kernel_env(tmp_path) -> dict[str, str]:
    """JUPYTER_PATH with a "python3" kernel that runs this interpreter, registered into a temp
    dir (the installed spec may say plain "python", whatever that is on PATH)."""
    env = {}
    prefix = tmp_path / "jupyter"
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


def test_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == ["01_quickstart.ipynb", "02_convert_hf.ipynb", "03_long_context.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    if "convert_hf" in path:
        pytest.importorskip("transformers")
        pytest.importorskip("torch")
    nb = nbformat.read(path, as_version=4)
    # Colab-ready: the first code cell installs the package unless it is importable.
    first = next(c for c in nb.cells if c.cell_type == "code").source
    assert "pip" in first and "import orthros_jax" in first
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "\nFULL = False" in "\n" + code and "/work/" not in code  # tiny default, no local paths
    for key, value in _kernel_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    # A fresh working directory: the notebooks may not rely on the repository's files.
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]  # fmt: skip
    assert not errors
