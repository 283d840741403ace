"""The workshop notebook runs top to bottom as an attendee's would, writes nothing outside its
out/ folder, and is committed without outputs."""

import json
import os
import re
import shutil
import subprocess

import pytest
from helpers import ROOT, copy_scripts

# requirements.txt pins them: where one is missing, every test here fails and says so. Not at import:
# a GPU machine's Python may have torch and pytest alone, and must still collect the suite to run
# its GPU tests (`pytest -m gpu`, benchmarks/gpu_checks.sh), which leaves these out.
try:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
except ImportError as error:
    MISSING = error
else:
    MISSING = None


@pytest.fixture(autouse=True)
def notebook_packages():
    if MISSING:
        pytest.fail(f"{MISSING}: requirements.txt pins it; pip install -r requirements.txt")


NOTEBOOK = ROOT / "walkthrough.ipynb"
MEMORY_KEPT = "benchmarks/memory.kept.json"  # what FSDP2's section shows of a rank's memory


def read_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def committed_notebook():
    """The notebook as git would commit it: the version in the index, so that an attendee's run,
    saved into the working file with its outputs, fails nothing. Outside a git checkout, or
    before the notebook is tracked, the working file."""
    try:
        staged = subprocess.run(
            ["git", "show", f":./{NOTEBOOK.name}"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return read_notebook()
    return nbformat.reads(staged.stdout, as_version=4)


def execute(notebook, folder, **settings):
    """Run the notebook's cells in folder, in a kernel whose every process is pinned to the CPU,
    as on a machine without a GPU. The WALKTHROUGH_* settings of whoever runs the tests are
    left out; settings adds some."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WALKTHROUGH_")}
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env=dict(env, CUDA_VISIBLE_DEVICES="", **settings))  # raises at the first failing cell
    return notebook


def copy_project(dest):
    """What the notebook reads: itself, its helpers (and traces.py), the twin scripts, the checker, the
    pitfalls, and the memory benchmark's kept run."""
    shutil.copy(NOTEBOOK, dest / NOTEBOOK.name)
    for helper in ("walkthrough_helpers.py", "traces.py"):
        shutil.copy(ROOT / helper, dest / helper)
    (dest / "benchmarks").mkdir()
    shutil.copy(ROOT / MEMORY_KEPT, dest / MEMORY_KEPT)
    shutil.copy(ROOT / "check_ddp.py", dest / "check_ddp.py")
    shutil.copytree(ROOT / "check_ddp", dest / "check_ddp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "pitfalls", dest / "pitfalls", ignore=shutil.ignore_patterns("__pycache__"))
    return copy_scripts(dest)


def files(folder):
    return {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def outputs(cell):
    return "".join(output.get("text", "") for output in cell.get("outputs", []))


def section(notebook, heading):
    """The code cells under the notebook's `## heading`, down to the next `## `."""
    cells, inside = [], False
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.M):
            inside = bool(re.search(rf"^## {re.escape(heading)}\b", cell.source, re.M))
        elif inside and cell.cell_type == "code":
            cells.append(cell)
    return cells


def plumbing_cell():
    """The cell that imports run(), FIGURES and the rest from walkthrough_helpers.py."""
    return next(cell for cell in read_notebook().cells if "from walkthrough_helpers import" in cell.source)


def test_the_notebook_is_committed_without_outputs():
    dirty = [
        i
        for i, cell in enumerate(committed_notebook().cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, (
        f"code cells {dirty} of walkthrough.ipynb, as staged for commit, hold outputs; strip them with "
        "python -c \"import nbformat as n; b = n.read('walkthrough.ipynb', 4); [c.update(outputs=[], "
        "execution_count=None) for c in b.cells if c.cell_type == 'code']; n.write(b, 'walkthrough.ipynb')\""
        " and git add walkthrough.ipynb again"
    )


def test_the_notebook_headings_are_the_steps_of_the_readme():
    markdown = "\n".join(cell.source for cell in read_notebook().cells if cell.cell_type == "markdown")
    headings = re.findall(r"^## DDP step (\d+): (.+)$", markdown, flags=re.M)
    readme = re.findall(
        r"^- \*\*DDP step (\d+): ([^*]+?)\.\*\*", (ROOT / "README.md").read_text(), flags=re.M
    )
    assert headings == readme


def markdown_of(notebook):
    return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]


def test_the_notebook_reads_in_the_lessons_order_and_length():
    # the ten DDP steps, then your turn, then FSDP2, the DDP twin's own twin, then what is not the
    # conversion (how fast, in time, pitfalls); its prose at most 2,000 words
    markdown = markdown_of(read_notebook())
    headings = [heading for text in markdown for heading in re.findall(r"^## (.+)$", text, flags=re.M)]
    turn = next(i for i, heading in enumerate(headings) if heading.startswith("Your turn"))
    assert headings[turn - 1] == "DDP step 10: evaluate exactly", headings
    after = [heading.split(":")[0] for heading in headings[turn + 1 :]]
    assert after[:3] == ["FSDP2", "How fast", "What DDP does in time"], headings
    words = sum(len(text.split()) for text in markdown)
    assert words <= 2000, f"the notebook's prose is {words} words"
    # an FSDP step it names is docs/fsdp.md's, by its number and its name
    from test_readme import FSDP_STEP

    steps = {n: name.replace("`", "") for n, name in FSDP_STEP.findall((ROOT / "docs/fsdp.md").read_text())}
    prose = re.sub(r"\s+", " ", "\n".join(markdown))
    named = [(m[1], prose[m.end() : m.end() + 80]) for m in re.finditer(r"FSDP step (\d+)", prose)]
    assert named, "the notebook names no FSDP step"
    assert all(n in steps and text.startswith(f": {steps[n]}") for n, text in named), (named, steps)


def test_the_notebooks_links_lead_to_files_and_their_headings():
    from test_readme import LINK, anchors  # one rule for every page's links

    broken = []
    for text in markdown_of(read_notebook()):
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = ROOT / file
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(target)
    assert not broken, broken


def test_the_picture_is_shown_before_any_code_runs():
    cells = read_notebook().cells
    first_code = next(i for i, cell in enumerate(cells) if cell.cell_type == "code")
    assert any("](figures/ddp.png)" in cell.source for cell in cells[:first_code])
    assert (ROOT / "figures/ddp.png").stat().st_size > 10_000  # committed, so it shows without a run


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_writes_only_its_out_folder_and_shows_what_it_says(tmp_path):
    given = files(copy_project(tmp_path))
    # one round of the scaling measurement, not 3: the same cells and code, a third of its runs
    notebook = execute(read_notebook(), tmp_path, WALKTHROUGH_ROUNDS="1")
    after = files(tmp_path)
    assert {path: after.get(path) for path in given} == given, "the notebook changed a file it was given"
    elsewhere = [path for path in after.keys() - given.keys() if path.parts[0] != "out"]
    assert all("__pycache__" in path.parts for path in elsewhere), elsewhere  # git ignores both
    assert not (tmp_path / "figures").exists()  # the README's figures only with WALKTHROUGH_FIGURES
    for figure in ("loss.png", "scaling.png", "timeline.png"):
        assert (tmp_path / "out/walkthrough" / figure).stat().st_size > 10_000, figure

    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    views = [
        outputs(cell).split("\n\n")[0] for cell in cells if re.search(r"^show_step\(", cell.source, re.M)
    ]
    assert len(views) == 10
    assert all(0 < len(view.splitlines()) <= 25 for view in views), views  # a step's lines, not a hunk

    text = "".join(map(outputs, cells))
    # the profiler's own lines (torch 2.13's "USDT:... profiler_start") stay out of the cells' outputs
    assert "profiler_st" not in text, [line for line in text.splitlines() if "profiler_st" in line]
    gaps = re.findall(r"N=(\d): largest per-epoch difference from the baseline, (\S+) loss: (\S+)", text)
    # on a CPU, the loss curves run 2 and 4 processes (one would be the baseline's run again)
    assert [(n, loss) for n, loss, _ in gaps] == [
        (n, loss) for loss in ("training", "held-out") for n in "24"
    ]
    assert all(float(gap) <= 1e-5 for _, _, gap in gaps), gaps  # the curves do overlap
    # and the scaling runs as many as there are cores, at most 4
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    scaling = [n for n in (1, 2, 4) if n <= cores]
    assert f"scaling: process counts {scaling}; rounds: 1" in text
    rows = re.findall(r"^(small|wide) +N=(\d): .* efficiency \d\.\d\d \(\d\.\d\d to \d\.\d\d\)", text, re.M)
    assert rows == [(regime, str(n)) for regime in ("small", "wide") for n in scaling]
    # each rank in time: every DDP rank all-reduces, the baseline never; smaller buckets make more
    # all-reduces, no_sync half as many for the same backward passes
    (timeline,) = [outputs(cell) for cell in cells if "print_communication(runs)" in cell.source]
    runs = re.findall(r"^(\S.*)\n((?:  rank .*\n)+)", timeline, re.M)
    counts = [
        [
            tuple(map(int, c))
            for c in re.findall(r"(\d+) backward passes, (\d+) optimizer steps, (\d+) all", ranks)
        ]
        for _, ranks in runs
    ]
    assert len(counts) == 4 and [len(c) for c in counts] == [2, 2, 2, 1], timeline
    torch_buckets, small_buckets, accumulating, (baseline,) = counts
    for each, small, every_2 in zip(torch_buckets, small_buckets, accumulating, strict=True):
        assert each[:2] == small[:2] == (4, 4) and every_2[:2] == (4, 2), timeline
        assert small[2] > each[2] > 0 and every_2[2] == each[2] / 2, timeline
    assert baseline == (4, 4, 0), timeline
    # FSDP2's section, each of its cells drawing a figure: train_fsdp.py run as DDP step 8's twin, with
    # --profile, its losses on the baseline's curve, drawn from that run
    fsdp = section(notebook, "FSDP2")
    assert len(fsdp) == 3 and all(
        any("image/png" in output.get("data", {}) for output in cell.outputs) for cell in fsdp
    ), [outputs(cell) for cell in fsdp]
    said = "".join(map(outputs, fsdp))
    command = "torchrun --standalone --nproc_per_node=2 train_fsdp.py --batch_size=32 --profile"
    assert f"$ {command} --out_dir=out/walkthrough/fsdp\n" in said, said
    assert (tmp_path / "out/walkthrough/fsdp/trace_rank1.json").is_file()
    fsdp_gaps = re.findall(
        r"^FSDP2 at N=2 against the baseline: largest per-epoch difference, (\S+) loss (\S+)$", said, re.M
    )
    assert [name for name, _ in fsdp_gaps] == ["training", "held-out"], said
    assert all(float(gap) <= 1e-5 for _, gap in fsdp_gaps), fsdp_gaps  # the FSDP proof's tolerance: one curve
    # what it wrote: at each save a folder of shards, a file of each rank's and the index; after the last
    # epoch, that folder and the whole file too (FSDP step 6)
    saved = dict(re.findall(r"^(model_epoch_\d+(?:\.pt)?) (.+)$", said, re.M))
    shards = str([".metadata", "__0_0.distcp", "__1_0.distcp"])
    assert saved == {"model_epoch_2": shards, "model_epoch_4": shards, "model_epoch_5": shards} | {
        "model_epoch_5.pt": "(one file, whole)"
    }, said
    # what a rank holds: the memory benchmark's kept run, its every figure as the file has it; and as
    # the prose says, the parameters, gradients and momentum 1/N of DDP's, and the peak falling with N on
    # the model of equal blocks, far less on ours
    kept = json.loads((ROOT / MEMORY_KEPT).read_text())

    def most(model, case, n, key):
        (found,) = [c for c in kept["cases"] if (c["model"], c["case"], c["nproc"]) == (model, case, n)]
        return max(rank[key] for rank in found["ranks"])

    counts = sorted({c["nproc"] for c in kept["cases"]})
    assert f"the kept run of benchmarks/memory.py, {kept['date']}: {kept['label']}\n" in said, said
    figures = re.findall(
        r"^(\w+), N=(\d): peak DDP (\S+) MiB a rank, FSDP2 (\S+) MiB: (\S+)x DDP's; "
        r"FSDP2's parameters, gradients and momentum (\S+) MiB$",
        said,
        re.M,
    )
    expected = []
    for model in kept["models"]:
        for n in counts:
            ddp_peak, fsdp_peak = most(model, "DDP", n, "peak"), most(model, "FSDP2", n, "peak")
            held = most(model, "FSDP2", n, "held")
            expected.append(
                (
                    model,
                    str(n),
                    f"{ddp_peak / 2**20:.2f}",
                    f"{fsdp_peak / 2**20:.2f}",
                    f"{fsdp_peak / ddp_peak:.2f}",
                    f"{held / 2**20:.2f}",
                )
            )
            assert held <= 1.05 * most(model, "DDP", n, "held") / n, (model, n)
    assert figures == expected, figures
    assert counts == [2, 4] and list(kept["models"]) == ["ours", "blocks"], kept["models"]
    ratio = {
        (m, n): most(m, "FSDP2", n, "peak") / most(m, "DDP", n, "peak")
        for m in kept["models"]
        for n in counts
    }
    assert ratio["blocks", 4] < ratio["blocks", 2] and ratio["blocks", 4] < ratio["ours", 4] - 0.2, ratio
    # its trace beside DDP step 8's run: DDP all-reduces; FSDP2 never does, and each step each of the 3
    # layers all-gathers its weights in forward and again in backward, and reduce-scatters its gradients
    (traced,) = [outputs(cell) for cell in fsdp if "print_communication(" in cell.source]
    panels = re.findall(r"^(\S.*)\n((?:  rank .*\n)+)", traced, re.M)
    assert [title.split(",")[0] for title, _ in panels] == ["DDP", "FSDP2"], traced
    each = (
        r"(\d+) backward passes, (\d+) optimizer steps, (\d+) all-reduces"
        r".*?(?:, (\d+) all-gathers, (\d+) reduce-scatters)?$"
    )
    ddp, sharded = (
        [tuple(int(x or 0) for x in c) for c in re.findall(each, ranks, re.M)] for _, ranks in panels
    )
    assert len(ddp) == len(sharded) == 2, traced
    assert all(steps[:2] == (4, 4) and steps[2] > 0 and steps[3:] == (0, 0) for steps in ddp), traced
    assert sharded == [(4, 4, 0, 2 * 3 * 4, 3 * 4)] * 2, traced
    # your turn: the report of a conversion without set_epoch names DDP step 3 (its lines labelled
    # "step N" or, as the README shows them, "DDP step N"); then the learner's script, in its cell as
    # given, not converted: the check runs it where it saves, and fails it from DDP step 1, the cell
    # running on
    assert re.findall(r"^check_ddp: (ok|FAIL)\b", text, re.M) == ["FAIL", "FAIL"]
    assert re.search(r"^(DDP )?step 3 +FAIL +shard the data: rank \d drew the same order", text, re.M), text
    yours = text[text.index("$ cd out/walkthrough\n$ python ../../check_ddp.py my_train.py") :]
    assert re.search(r"^DDP step 1 +FAIL +init the process group: no rank called", yours, re.M), yours
    assert (tmp_path / "out/walkthrough/ckpt.pt").is_file()  # it ran for real, in its folder
    # and the README shows the report of that same conversion: the same verdict at every step
    shown = re.search(r"<!-- check-report -->\n```text\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    verdicts = re.compile(r"^(?:DDP )?step (\d+) +(ok|warn|FAIL|--) ", re.M)
    first_report = text[text.index("$ python check_ddp.py") :].split("\ncheck_ddp: FAIL")[0]
    assert len(verdicts.findall(shown.group(1))) >= 8
    assert verdicts.findall(shown.group(1)) == verdicts.findall(first_report)


# What each step's view must show (the lines it needs, complete) and must not (another step's lines,
# or lines that are not DDP).
STEP_VIEWS = {
    1: (
        ["import torch.distributed as dist", "dist.init_process_group(backend"],
        ["set_device", "return device"],
    ),
    2: (["LOCAL_RANK", "torch.cuda.set_device(device)"], ["init_process_group"]),
    3: (
        ["DistributedSampler(dataset, seed", "sampler.set_epoch(epoch)"],
        ["DataLoader(", "BatchSampler(sampler"],
    ),
    4: (
        ["model = DDP(", "device_ids=[device.index]", "bucket_cap_mb=args.bucket_cap_mb"],
        ["init_process_group"],
    ),
    5: (["totals = torch.stack", "dist.all_reduce(totals)", "dist.get_world_size()"], ["val_totals"]),
    6: (["dist.broadcast_object_list(choice)", "if dist.get_rank() == 0:", "model.module, optimizer"], []),
    7: (["def cleanup():", "dist.destroy_process_group()", "cleanup()  # DDP step 7"], []),
    8: (["torchrun --standalone --nproc_per_node=2 train_ddp.py --batch_size 32"], ["check_launch"]),
    9: (["last = ", "model.no_sync()", ".backward()"], ["optimizer.step()"]),
    10: (
        ["range(dist.get_rank(), len(val_set)", "val_totals = torch.stack", "dist.all_reduce(val_totals)"],
        [],
    ),
}


def test_each_step_view_shows_its_own_lines_complete(tmp_path):
    loop = "for n in range(1, 11):\n    print(f'== step {n}')\n    show_step(n)"
    notebook = nbformat.v4.new_notebook(
        cells=[plumbing_cell(), nbformat.v4.new_code_cell(loop)], metadata=read_notebook().metadata
    )
    execute(notebook, copy_project(tmp_path))
    views = re.findall(
        r"^== step (\d+)\n(.*?)(?=^== step |\Z)", outputs(notebook.cells[-1]), flags=re.S | re.M
    )
    assert [int(n) for n, _ in views] == list(STEP_VIEWS)
    for n, view in views:
        shows, never = STEP_VIEWS[int(n)]
        assert all(text in view for text in shows), f"step {n}'s view lacks one of {shows}:\n{view}"
        assert not any(text in view for text in never), f"step {n}'s view shows one of {never}:\n{view}"


@pytest.mark.slow
def test_a_failed_run_fails_its_cell(tmp_path):
    notebook = nbformat.v4.new_notebook(
        cells=[plumbing_cell(), nbformat.v4.new_code_cell('run("train_ddp.py", "--batch_size=0", nproc=2)')],
        metadata=read_notebook().metadata,
    )
    with pytest.raises(CellExecutionError, match="exited with 1"):
        execute(notebook, copy_project(tmp_path))


def test_the_figures_go_where_walkthrough_figures_says(tmp_path):
    notebook = nbformat.v4.new_notebook(
        cells=[
            plumbing_cell(),
            nbformat.v4.new_code_cell("print(FIGURES)"),
            nbformat.v4.new_code_cell("fresh('x')"),
        ],
        metadata=read_notebook().metadata,
    )
    execute(notebook, copy_project(tmp_path), WALKTHROUGH_FIGURES="figures")
    assert outputs(notebook.cells[1]) == "figures\n"
    # made by the notebook's first run (fresh), not by importing its plumbing
    assert (tmp_path / "figures").is_dir() and (tmp_path / "out/walkthrough").is_dir()
