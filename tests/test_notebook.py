"""The example notebook (examples/quickstart.ipynb) runs headless, as written, with nbclient:
on the test cluster when it is up (backend "auto"), else on this machine."""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT

# A kernel, two sweeps; on the cluster when it is up, else on this machine.
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_the_quickstart_notebook_runs(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for folder in ("sweeps", "examples"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    monkeypatch.setenv("SLURMKIT_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    nb = nbformat.read(tmp_path / "examples" / "quickstart.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = {
        i: "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in c.outputs)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
    }
    text = "\n".join(outputs.values())
    assert "8 trials" in text and "{'COMPLETED': 8}" in text
    assert "{'loss': " in text  # fs.result(0)
    assert "(1024, [1, 4, 9])" in text  # the executor's job.result()
    assert not (tmp_path / "loss_vs_lr.png").exists()  # the notebook writes where it should
    (fit,) = (tmp_path / "runs").glob("fit-*")
    assert (fit / "loss_vs_lr.png").stat().st_size > 1000
    bar = outputs[3]  # sw.wait(progress=True): a bar, drawn as text without ipywidgets
    assert "trials ━" in bar and "8/8" in bar and "ipywidgets" not in text
    assert len(list((tmp_path / "runs").glob("quickstart-*"))) == 1
    assert len(list((tmp_path / "runs").glob("fit-*"))) == 1
    # the ASHA cell: pruned trials, the best one complete, the curves beside the sweep
    asha = outputs[max(outputs)]
    assert "'PRUNED': " in asha and "'q': 0.0" in asha and "'state': 'COMPLETED'" in asha
    (curves,) = (tmp_path / "runs").glob("curve-*")
    assert (curves / "curves.png").stat().st_size > 1000
    assert not (tmp_path / "curves.png").exists()
