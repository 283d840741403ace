"""The workshop notebook runs top to bottom as an attendee's would, and is stored clean."""

import re
import shutil

import nbformat
import pytest
from helpers import ROOT, copy_scripts
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK = ROOT / "walkthrough.ipynb"


def read_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def execute(notebook, folder):
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute()  # raises CellExecutionError at the first cell that fails
    return notebook


def copy_project(dest):
    shutil.copy(NOTEBOOK, dest / NOTEBOOK.name)
    return copy_scripts(dest)


def test_the_notebook_is_stored_without_outputs():
    dirty = [
        i
        for i, cell in enumerate(read_notebook().cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, (
        f'code cells {dirty} hold outputs; strip them with python -c "import nbformat as n; '
        "b = n.read('walkthrough.ipynb', 4); [c.update(outputs=[], execution_count=None) for c in b.cells "
        "if c.cell_type == 'code']; n.write(b, 'walkthrough.ipynb')\""
    )


def test_the_notebook_headings_are_the_steps_of_the_readme():
    markdown = "\n".join(cell.source for cell in read_notebook().cells if cell.cell_type == "markdown")
    headings = re.findall(r"^## Step (\d+): (.+)$", markdown, flags=re.M)
    readme = re.findall(r"^\| (\d+) \| ([^|]+?) \|", (ROOT / "README.md").read_text(), flags=re.M)
    assert headings == readme


def test_the_notebook_runs_top_to_bottom_and_shows_what_it_says(tmp_path):
    notebook = execute(read_notebook(), copy_project(tmp_path))
    for figure in ("loss.png", "scaling.png"):
        assert (tmp_path / "figures" / figure).stat().st_size > 10_000, figure
    text = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    gaps = re.findall(r"N=(\d): largest per-epoch loss difference from the baseline: (\S+)", text)
    assert [n for n, _ in gaps] == ["1", "2", "4"]
    assert all(float(gap) <= 1e-5 for _, gap in gaps), gaps  # the curves do overlap
    assert len(re.findall(r"efficiency \d\.\d\d", text)) == 6  # 2 regimes x 3 process counts


def test_a_failed_run_fails_its_cell(tmp_path):
    setup = read_notebook().cells[1]
    assert "def run(" in setup.source
    notebook = nbformat.v4.new_notebook(
        cells=[setup, nbformat.v4.new_code_cell('run("train_ddp.py", "--batch_size=0", nproc=2)')],
        metadata=read_notebook().metadata,
    )
    with pytest.raises(CellExecutionError, match="exited with 1"):
        execute(notebook, copy_project(tmp_path))
