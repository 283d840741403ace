"""Every figure a page states comes from a kept run, or says it is an estimate.

A kept run is a benchmark's own output, written beside it with its date, machine and load
(`benchmarks/*.kept.json`, by each benchmark's --keep), or pytest's report of a run of the suite
(`tests/timings/`, written by --junitxml, with the machine and load conftest.py adds). A page shows
a kept output between `<!-- kept: PATH -->` (or one section of it, PATH#NAME) and `<!-- end kept -->`,
exactly as it was printed; a figure in its prose is read here from the kept files, and tied to the
sentence that states it. Any other time, rate or ratio on a page is an error, unless its paragraph
calls itself an estimate."""

import ast
import importlib.util
import inspect
import json
import re
import statistics
import textwrap
from argparse import Namespace
from xml.etree import ElementTree

import helpers
from helpers import ROOT
from test_troubleshooting import nccl_default
from torch.distributed.constants import default_pg_timeout

README, TESTS_README, BENCHMARKS_README = (
    ROOT / "README.md",
    ROOT / "tests/README.md",
    ROOT / "benchmarks/README.md",
)
CHECK_PAGE, TROUBLESHOOTING = ROOT / "docs/check-ddp.md", ROOT / "docs/troubleshooting.md"
FSDP_PAGE = ROOT / "docs/fsdp.md"
KEPT_REGION = re.compile(r"<!-- kept: (\S+) -->\n(.*?)<!-- end kept -->\n?", flags=re.S)
# the README's sample report of check_ddp.py: its figures are its kept job's (test_the_readmes_sample_...
# below); test_notebook.py and test_check_ddp.py tie the rest to a real check of today
SAMPLE_REPORT = re.compile(r"<!-- check-report -->\n```text\n.*?^```$", flags=re.S | re.M)
# a measured figure: a time, a rate, a ratio, a share (not a size, a count or a setting), its unit
# after a space, a hyphen or nothing ("40 s", "40-s", "40s")
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:k|x|%|[ -]?(?:ms|s|secs?|seconds?|mins?|minutes?|h|hours?|samples/s)\b)"
)
# a paragraph that calls itself an estimate: the word, not a word that holds it ("underestimated")
ESTIMATE = re.compile(r"\bestimated?s?\b", flags=re.I)


def kept(path):
    return json.loads((ROOT / path).read_text())


def assigned(path, name):
    """The literal value a module assigns to name, read without running it."""
    tree = ast.parse((ROOT / path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == name)
    return ast.literal_eval(node.value)


def shown(page):
    """Each kept output the page shows: its path, and the lines shown (code fences and blank lines aside)."""
    for path, text in KEPT_REGION.findall(page.read_text()):
        yield path, [line for line in text.splitlines() if line.strip() and not line.startswith("```")]


def test_every_kept_output_a_page_shows_is_what_its_benchmark_printed():
    # a region shows a kept run whole (PATH), or one section of it (PATH#NAME: the lines its benchmark
    # printed as that section, in the file's "sections", each a part of what it printed)
    regions = [
        (page, path, lines)
        for page in (README, TESTS_README, BENCHMARKS_README, TROUBLESHOOTING)
        for path, lines in shown(page)
    ]
    assert regions, "no page shows a kept output"
    for page, path, lines in regions:
        path, _, section = path.partition("#")
        record = kept(path)
        assert {"date", "command", "machine", "load_average", "printed", "environment"} <= record.keys(), path
        printed = [
            f"$ {record['command']}",
            *(line for line in record["printed"].splitlines() if line.strip()),
        ]
        if section:
            assert record["sections"][section] in record["printed"], f"{path}#{section} was not printed"
            printed = [line for line in record["sections"][section].splitlines() if line.strip()]
        assert lines == printed, f"{page.relative_to(ROOT)} shows {path} otherwise than it was printed"
    on_pages = {path.partition("#")[0] for _, path, _ in regions}
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("*.kept.json")}
    assert files == on_pages, f"kept outputs no page shows: {files - on_pages}"


# What each kept file says of itself ------------------------------------------------------------------------


def memory_code(models):
    """The functions of benchmarks/memory.py that print its tables, run from its own source with the
    models a kept run had: the lines it printed, as it makes them from the cases it keeps."""
    tree = ast.parse((ROOT / "benchmarks/memory.py").read_text())
    names = ("mib", "largest", "summary", "reference", "table")
    module = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names], [])
    scope = {"statistics": statistics, "MODELS": models}
    exec(compile(module, "benchmarks/memory.py", "exec"), scope)
    return scope


def benchmark_code(names, **context):
    """The functions of benchmarks/benchmark.py named, run from its own source with the context given
    (the cases and process counts a kept run had): the summaries it kept, as it computes them."""
    tree = ast.parse((ROOT / "benchmarks/benchmark.py").read_text())
    module = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names], [])
    scope = {"statistics": statistics, "REGIMES": assigned("benchmarks/benchmark.py", "REGIMES"), **context}
    exec(compile(module, "benchmarks/benchmark.py", "exec"), scope)
    return scope


def spread(values, spec):
    """The median of values, and their range, as the benchmarks print them: "7.5 s  (7.2 to 8.1)"."""
    low, median, high = (f"{v:{spec}}" for v in (min(values), statistics.median(values), max(values)))
    return median, f"({low} to {high})"


def reprinted(path, record):
    """What a kept file's benchmark printed, made again from the measurements the file keeps, and the
    summaries it keeps, made again from its rounds: ({summary: (kept, made again)}, [printed lines])."""
    name = path.removeprefix("benchmarks/").removesuffix(".kept.json")
    summaries, lines = {}, []
    rounds = record.get("rounds")
    if name == "check_cost":
        lines += [
            f"round {r}: run {o['run']:.1f} s, check {o['check']:.1f} s" for r, o in enumerate(rounds, 1)
        ]
        for case in ("run", "check"):
            values = [one[case] for one in rounds]
            summaries[f"median_s {case}"] = (record["median_s"][case], statistics.median(values))
            median, range_ = spread(values, ".1f")
            lines.append(f"{case:5}  median {median} s  {range_}")
        ratios = [one["check"] / one["run"] for one in rounds]
        summaries["check_over_run"] = (record["check_over_run"], statistics.median(ratios))
        lines.append("check / run, per round: median {} {}".format(*spread(ratios, ".2f")))
    elif name == "notebook_time":  # each run, with its date, machine and load; then their range
        runs = record["runs"]
        lines += [
            f"{run['date']}, {run['machine']} ({run['cpu']}), load average {run['load'][0]:.1f} to"
            f" {run['load'][1]:.1f}: {run['seconds']:.0f} s"
            for run in runs
        ]
        seconds = [run["seconds"] for run in runs]
        lines.append(f"default run: {min(seconds):.0f} to {max(seconds):.0f} s over {len(runs)} runs")
    elif name.startswith("batch_fetch"):
        lines += [
            f"round {r}: whole {one['whole']:,.0f} samples/s, items {one['items']:,.0f} samples/s"
            for r, one in enumerate(rounds, 1)
        ]
        for case in ("whole", "items"):
            median, range_ = spread([one[case] for one in rounds], ",.0f")
            lines.append(f"{case:5}  median {median} samples/s  {range_}")
        ratios = [one["whole"] / one["items"] for one in rounds]  # kept from epochs/s: to rounding
        summaries["whole_over_items"] = tuple(
            [round(r, 9) for r in x] for x in (record["whole_over_items"], ratios)
        )
        lines.append("whole / items, per round: median {}x {}".format(*spread(ratios, ".1f")))
    elif name == "buckets":

        def summary(values, spec):
            return " ".join(spread(values, spec)) if len(values) > 1 else f"{values[0]:{spec}}"

        def per_rank(cap, key, spec):
            ranks = range(len(rounds[0][cap][key]))
            values = [[one[cap][key][r] for one in rounds if one[cap][key][r] is not None] for r in ranks]
            return " / ".join(summary(v, spec) if v else "none" for v in values)

        for cap in record["caps"]:
            buckets = ", ".join(f"{b:g}" for b in sorted({b for one in rounds for b in one[cap]["buckets"]}))
            speed = summary([one[cap]["samples_per_sec"] for one in rounds], ",.0f")
            ms, hidden = per_rank(cap, "all_reduce_ms", ".1f"), per_rank(cap, "hidden", ".0%")
            lines.append(f"| {cap} | {buckets} | {ms} | {hidden} | {speed} |")
    elif name == "benchmark":
        cases = list(record["measured"])
        nprocs = sorted({int(n) for case in cases for n in re.findall(r"^\w+ N=(\d+)$", case)})
        code = benchmark_code(
            ("summary", "flag", "summarize"),
            cases=cases,
            regimes={case.split()[0]: None for case in cases if case.endswith(" baseline")},
            nprocs=nprocs,
            widest=nprocs[-1] if len(nprocs) > 1 else None,
            accumulating=next((int(n) for case in cases for n in re.findall(r"N=(\d+) K=4$", case)), None),
        )
        made = code["summarize"]([one for one in rounds if len(one) == len(cases)])  # the complete rounds
        summaries |= {key: (record[key], made[key]) for key in ("measured", "derived")}
        for case, stats in made["measured"].items():
            unit = "s (wall, whole job" if case in ("first result", "floor") else "samples/s"
            lines.append(
                f"| {case} | {stats['median']:,.2f} | {stats['min']:,.2f} | {stats['max']:,.2f} | {unit}"
            )
        for key, stats in made["derived"].items():
            row = f"| {key} | {stats['median']:.3f} | {stats['min']:.3f} | {stats['max']:.3f} |"
            lines.append(f"{row} {made['meaning'][key]} |")
        lines += [textwrap.fill(line, width=88, subsequent_indent="  ") for line in made["explained"]]
        lines.append(f"in {record['minutes']:.1f} minutes")
    elif name == "memory":  # benchmarks/memory.py's tables, made again by its own code from the cases it kept
        cuda = any(rank["cuda_peak"] is not None for case in record["cases"] for rank in case["ranks"])
        lines += memory_code(record["models"])["table"](record["cases"], cuda)
        for case in record["cases"]:  # each rank's peak is the most of its rounds, every round kept
            for rank, line in enumerate(case["ranks"]):
                summaries[f"{case['model']} {case['case']} N={case['nproc']} rank {rank} peak"] = (
                    line["peak"],
                    max(round_[rank]["peak"] for round_ in case["peaks"]),
                )
    elif name == "hang_tools":  # no measurement: each hang's section, as it was printed, in order
        lines += [
            f"hang_tools: each hang a pitfall's mistake, under each tool; {record['backend']}, 2 processes,"
            f" a {record['timeout_s']} s timeout",
            "\n".join(record["sections"].values()),
        ]
    # the line every kept file ends with: when, where, and under what load
    load = record["load_average"]
    lines.append(
        f"kept in {path}: {record['date']}; {record['machine']} ({record['environment']['cpu']}); "
        f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end"
    )
    return summaries, lines


def test_each_kept_file_keeps_the_summaries_and_printed_lines_its_own_measurements_give():
    # a kept figure edited, with the page that shows it, is caught here: each summary a kept file keeps
    # (a median, a ratio) is made again from the rounds it keeps, and each line it printed from them
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("*.kept.json"))
    assert len(files) >= 6, files
    for path in files:
        record = kept(path)
        summaries, lines = reprinted(path, record)
        assert len(lines) >= 2, f"{path}: no benchmark of that name is known here"
        for name, (saved, made) in summaries.items():
            assert saved == made, f"{path}: its {name} is not what its own rounds give"
        printed = record["printed"]
        missing = [line for line in lines if line not in printed]
        assert not missing, f"{path}: printed otherwise than its own measurements give: {missing}"


def test_the_readmes_sample_report_is_its_kept_job_judged_again_times_and_all():
    # the README shows what its check printed, its times too; the job that printed it is kept
    # (tests/readme_report_job/), and judged again it prints the same, all but the job's folder
    from test_check_ddp import README_JOB, README_REPORT, normalised

    from check_ddp.job import Job
    from check_ddp.records import FORMAT
    from check_ddp.report import report
    from check_ddp.verdict import judge
    from check_ddp.worker import recorder

    record = "python tests/record_check_ddp_jobs.py --readme"
    assert Job.made_by(README_JOB) == (FORMAT, recorder()), f"recorded by another version: {record}"
    job = Job.load(README_JOB)
    _, shown = README_REPORT.search(README.read_text()).groups()
    assert normalised(shown) == normalised(report(job, judge(job))), (
        f"the README's sample report is not its kept job's: {record}"
    )


# The suite's own times ----------------------------------------------------------------------------------


def suite_run(tier):
    """The kept report of one tier, tests/timings/full.xml or quick.xml: pytest's own, of the README's
    command (`-m "not slow"` added for the quick tier) run whole, in one session, as CI runs it."""
    suite = ElementTree.parse(ROOT / f"tests/timings/{tier}.xml").getroot().find("testsuite")
    cases = list(suite.iter("testcase"))
    return {
        **suite.attrib,
        **{p.get("name"): p.get("value") for p in suite.iter("property")},
        "files": {case.get("classname").rpartition(".")[2] for case in cases},
        "cases": {case.get("name"): float(case.get("time")) for case in cases},
        "failed": [
            f"{case.get('classname')}::{case.get('name')}"
            for case in cases
            if case.find("failure") is not None or case.find("error") is not None
        ],
        "skips": [skip.get("message") for skip in suite.iter("skipped")],
    }


def test_the_kept_runs_of_the_suite_passed_skipped_only_gpu_tests_and_ran_every_file():
    files = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    for tier in ("quick", "full"):
        run = suite_run(tier)
        kept = f"tests/timings/{tier}.xml"
        assert run["files"] == files, f"{kept}: files it did not run: {files - run['files']}"
        # this file, in the kept run, read the figures that run was about to replace: what it said
        # there is void (it runs again on every run); every other test passed
        failed = [name for name in run["failed"] if not name.startswith("tests.test_figures::")]
        assert not failed, f"{kept}: a run that failed: {failed}"
        # tests/README.md: nothing skips but the GPU set, where there is no GPU
        assert all("GPU" in skip for skip in run["skips"]), f"{kept} skipped: {run['skips']}"


def test_the_kept_runs_of_the_suite_ran_todays_tests(collected):
    # a tier's figure (its minutes, its count of tests) is of the suite as it is: for each file this
    # session collected, the kept run of each tier ran exactly the tests it holds today (the quick
    # tier, those not slow); a test added, renamed or removed since needs the tiers run again
    files = {nodeid.partition("::")[0] for nodeid, _ in collected}
    for tier in ("full", "quick"):
        suite = ElementTree.parse(ROOT / f"tests/timings/{tier}.xml").getroot().find("testsuite")
        ran = {
            f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
            for case in suite.iter("testcase")
        }
        ran = {nodeid for nodeid in ran if nodeid.partition("::")[0] in files}
        today = {nodeid for nodeid, slow in collected if tier == "full" or not slow}
        assert ran == today, (
            f"tests/timings/{tier}.xml is of another suite: run the tier again (tests/README.md); "
            f"not run there: {sorted(today - ran)}; gone since: {sorted(ran - today)}"
        )


def suite_figures():
    """The figures the pages give of the suite's times, as each sentence gives them."""
    quick, full = suite_run("quick"), suite_run("full")

    def when(run):
        low, high = run["load_average_start"], run["load_average_end"]
        return f"on {run['timestamp'][:10]}, load average {low} to {high}"

    walkthrough = next(
        t for name, t in full["cases"].items() if name.startswith("test_the_notebook_runs_top_to_bottom")
    )
    meta_test = sum(t for name, t in full["cases"].items() if "never_fired" in name)
    return {
        README: [],  # the learner's path states no time: tests/README.md does
        TESTS_README: [
            f"{float(full['time']) / 60:.1f} minutes for {full['tests']} tests",
            when(full),
            f"{float(quick['time']):.0f} s for {quick['tests']} tests",
            when(quick),
            f"the notebook {walkthrough:.0f} s",
            f"the faults' meta-test ({meta_test:.0f} s here)",
        ],
    }


# Every figure, traced ----------------------------------------------------------------------------------


def traced():
    """Each page's figures, each in the words that state it, computed from the kept runs and the code."""
    cost = kept("benchmarks/check_cost.kept.json")["median_s"]
    figures = suite_figures()
    figures[CHECK_PAGE] = [f"About one run: {cost['check']:.1f} s against {cost['run']:.1f} s"]
    figures[TROUBLESHOOTING] = [
        f"after {nccl_default().total_seconds() / 60:.0f} minutes",  # the rows of a hang: torch's defaults
        f"after {default_pg_timeout.total_seconds() / 60:.0f} minutes",  # (test_troubleshooting.py)
        f"Timeout(ms)={nccl_default().total_seconds() * 1000:.0f}",  # and their messages say so
        f"Timed out waiting {default_pg_timeout.total_seconds() * 1000:.0f}ms",
    ]
    run_limit = inspect.signature(helpers.run).parameters["timeout"].default
    figures[TESTS_README] += [
        f"{run_limit} s unless a test says otherwise",
        f"within {assigned('tests/test_proofs.py', 'ENDS_WITHIN_S')} s",
        f"gloo's {default_pg_timeout.total_seconds() / 60:.0f}-minute timeout",
        f"with a {assigned('tests/test_troubleshooting.py', 'SECONDS')} s timeout",
    ]
    figures[BENCHMARKS_README] = benchmark_figures() + memory_figures()
    figures[FSDP_PAGE] = memory_figures()
    return figures


def memory_figures():
    """What benchmarks/memory.py's kept run says of FSDP2 against DDP, in the words both pages use, and
    the claims they make of it, checked (the rank that measured the most, each case against DDP's at the
    same N): the parameters, gradients and momentum a rank holds at its step, 1/N of DDP's; the peak of
    a step, at most 0.40x DDP's at N=4 on the model of equal blocks (issue 46's aim), far less saved on
    ours, whose middle layer is nearly all of it; reshard_after_forward=False and the three ways to
    accumulate, in memory and bytes sent; and the time, the price."""
    run = kept("benchmarks/memory.kept.json")
    twin, kept_whole = "FSDP2", "FSDP2, reshard_after_forward=False"
    ways = {
        "each": "FSDP2, 2 micro-batches, reduce-scatter each",
        "sync": "FSDP2, 2 micro-batches, set_requires_gradient_sync(False)",
        "keep": "FSDP2, 2 micro-batches, and set_reshard_after_backward(False)",
    }

    def find(model, case, n):
        (found,) = [c for c in run["cases"] if (c["model"], c["case"], c["nproc"]) == (model, case, n)]
        return found

    def most(model, case, n, key="peak"):
        return max(rank[key] for rank in find(model, case, n)["ranks"])

    def ratio(model, case, n, key="peak", ddp="DDP"):
        return most(model, case, n, key) / most(model, ddp, n, key)

    held = {n: ratio("blocks", twin, n, "held") for n in (2, 4)}
    assert all(abs(ratio(m, twin, n, "held") - 1 / n) < 0.01 for m in run["models"] for n in (2, 4)), held
    peak = {(m, n): ratio(m, twin, n) for m in run["models"] for n in (2, 4)}
    assert peak["blocks", 4] <= 0.40, peak  # issue 46's aim
    assert peak["blocks", 4] < peak["blocks", 2] and peak["ours", 4] > peak["blocks", 4] + 0.2, peak
    sizes = [
        p.numel() * 4 / 2**20 for p in baseline_module().make_model(Namespace(hidden_size=1024)).parameters()
    ]
    whole = {case: ratio("blocks", case, 4) for case in (twin, kept_whole)}
    sent = {case: most("blocks", case, 4, "sent") / 2**20 for case in (twin, kept_whole, *ways.values())}
    assert whole[kept_whole] > whole[twin] and sent[kept_whole] < sent[twin], (whole, sent)
    # "on ours, the peak stays where it is": within a buffer of a few KiB, as the rounds' own peaks vary
    assert all(abs(most("ours", kept_whole, n) / most("ours", twin, n) - 1) < 0.02 for n in (2, 4)), "ours"
    micro = {way: ratio("blocks", case, 4, ddp="DDP, 2 micro-batches, no_sync") for way, case in ways.items()}
    assert micro["each"] < micro["sync"] < micro["keep"], micro
    assert sent[ways["each"]] > sent[ways["sync"]] > sent[ways["keep"]], sent
    step = {case: statistics.median(find("blocks", case, 2)["step_ms"]) for case in ("DDP", twin)}
    assert step[twin] > step["DDP"], "time is the price"
    return [
        f"{held[2]:.2f}x DDP's at N=2 and {held[4]:.2f}x at N=4",
        f"its peak is {peak['blocks', 2]:.2f}x DDP's at N=2 and {peak['blocks', 4]:.2f}x at N=4",
        f"{peak['ours', 2]:.2f}x at N=2 and {peak['ours', 4]:.2f}x at N=4",
        f"{max(sizes):.2f} of its {sum(sizes):.2f} MiB",
        f"raises the peak to {whole[kept_whole]:.2f}x DDP's at N=4, and sends "
        f"{sent[kept_whole]:.2f} MiB a step instead of {sent[twin]:.2f}",
        f"{micro['each']:.2f}x, {micro['sync']:.2f}x and {micro['keep']:.2f}x DDP's peak",
        f"{sent[ways['each']]:.2f}, {sent[ways['sync']]:.2f} and {sent[ways['keep']]:.2f} MiB a step",
        f"{step[twin]:.1f} ms against DDP's {step['DDP']:.1f} ms",
    ]


def baseline_module():
    """single_gpu_baseline.py, imported: its make_model, the twins' model."""
    spec = importlib.util.spec_from_file_location("baseline", ROOT / "single_gpu_baseline.py")
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return baseline


def benchmark_figures():
    """benchmarks/README.md's figures, from its kept runs and its code."""
    figures = []
    # the wide model's gradients: the twins' model, at the wide regime's width
    regimes = assigned("benchmarks/benchmark.py", "REGIMES")
    width = int(regimes["wide"][regimes["wide"].index("--hidden_size") + 1])
    spec = importlib.util.spec_from_file_location("baseline", ROOT / "single_gpu_baseline.py")
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    sizes = [
        p.numel() * p.element_size() / 2**20
        for p in baseline.make_model(Namespace(hidden_size=width)).parameters()
    ]
    figures.append(f"are {sum(sizes):.2f} MiB, {max(sizes):g} MiB of them the middle layer's weights")
    # fetching batches whole, against item by item: the median ratio within a round
    ratios = [
        statistics.median(kept(f"benchmarks/{name}.kept.json")["whole_over_items"])
        for name in ("batch_fetch", "batch_fetch_1024")
    ]
    figures.append(
        f"loading is about {ratios[0]:.0f}x faster whole; at the wide regime's batch of 1024, "
        f"about {ratios[1]:.0f}x"
    )
    # the benchmark's kept run, and what the page says it shows
    run = kept("benchmarks/benchmark.kept.json")
    load, derived = run["load_average"], {name: d["median"] for name, d in run["derived"].items()}
    speed = {name: m["median"] for name, m in run["measured"].items()}
    batch = {regime: int(flags[flags.index("--batch_size") + 1]) for regime, flags in regimes.items()}
    step_ms = {name: 1000 * batch["small"] / speed[f"small {name}"] for name in ("N=1", "baseline")}
    share = {model: derived[f"{model}_allreduce_share_n2"] for model in ("small", "wide")}
    accumulating = run["derived"]["small_accum_k4_speedup_n2"]
    figures += [
        f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end, "
        f"on its {load['cores']} cores",
        f"about {ratios[0]:.0f}x faster at the scripts' defaults",
        f"Here it is {step_ms['N=1'] - step_ms['baseline']:.2f} ms a step ({step_ms['N=1']:.2f} against "
        f"{step_ms['baseline']:.2f} ms, the medians of N=1 and the baseline)",
        f"at {derived['ddp_overhead_small']:.2f} of the baseline; the wide model's longer step hides more "
        f"of it ({derived['ddp_overhead_wide']:.2f})",
        f"gains {speed['wide N=2'] / speed['wide N=1']:.1f}x from the second core (efficiency "
        f"{derived['wide_efficiency_n2']:.2f}); the all-reduce takes {share['wide']:.0%} of its step",
        f"({speed['small N=2'] / 1000:.0f}k against {speed['small N=1'] / 1000:.0f}k samples/s at N=1, "
        f"efficiency {derived['small_efficiency_n2']:.2f})",
        f"the all-reduce takes {share['small']:.0%} of its step, and without it the efficiency would be "
        f"{derived['small_efficiency_n2_no_allreduce']:.2f}",
        f"made the small model {accumulating['median']:.1f}x faster at N=2 here, from "
        f"{accumulating['min']:.2f} to {accumulating['max']:.2f} across rounds",
        f"is {derived['first_result_gap_s']:.1f} s above the floor",
    ]
    # and what it says without a number: the claims the figures must bear out
    assert step_ms["N=1"] > step_ms["baseline"], "DDP costs a fixed time per step"
    assert derived["ddp_overhead_wide"] > derived["ddp_overhead_small"], "the wide model hides more of it"
    assert speed["wide N=2"] > speed["wide N=1"] and speed["small N=2"] < speed["small N=1"], speed
    assert share["small"] > share["wide"], "the small model is the communication-bound one"
    spread = max(m["max"] / m["min"] for m in run["measured"].values())
    assert spread >= 2, "the page says the rounds disagree, some by factors of two and more"
    # what the bucket size changes: buckets a step; the share of the all-reduce hidden under backward,
    # the median on each rank, in the order the page says (more buckets, more hidden); throughput
    # that no bucket size changes measurably (each median within the others' ranges)
    buckets = kept("benchmarks/buckets.kept.json")

    def per_rank(cap, key):
        return [statistics.median(one[cap][key][rank] for one in buckets["rounds"]) for rank in (0, 1)]

    count = {cap: f"{per_rank(cap, 'buckets')[0]:g}" for cap in buckets["caps"]}
    figures.append(
        f"{count['torch']} with torch's default, {count['25']} with 25, {count['0.001']} with 0.001"
    )
    hidden = {cap: per_rank(cap, "hidden") for cap in buckets["caps"]}
    figures += [
        f"backward is done: {hidden['25'][0]:.0%} and {hidden['25'][1]:.0%} of its time",
        f"hide more, {hidden['torch'][0]:.0%} and {hidden['torch'][1]:.0%}",
        f"hide the most, {hidden['0.001'][0]:.0%} and {hidden['0.001'][1]:.0%}",
    ]
    assert all(hidden["0.001"][r] > hidden["torch"][r] > hidden["25"][r] for r in (0, 1)), hidden
    speeds = {cap: [one[cap]["samples_per_sec"] for one in buckets["rounds"]] for cap in buckets["caps"]}
    for values in speeds.values():  # "Each median lies within the others' ranges"
        assert all(min(other) <= statistics.median(values) <= max(other) for other in speeds.values()), speeds
    # gpu_checks.sh's stages, each under its limit
    limits = re.findall(r"\b\w+_limit=(\d+)", (ROOT / "benchmarks/gpu_checks.sh").read_text())
    figures.append(f"they add up to {sum(map(int, limits)) / 60:.1f} minutes")
    return figures


def test_a_figure_is_seen_however_its_unit_is_written_and_only_an_estimate_is_excused():
    text = "40s, 40 s, 40-s, 3.5 ms, 2 minutes, 1.5x, 12%, 20k, 1h, 90 seconds, 7,500 samples/s"
    assert [m.group(0) for m in FIGURE.finditer(text)] == text.split(", ")
    # a size, a count, a setting, a name are not figures
    assert not FIGURE.findall("2 processes, 64 samples, 25 MiB, DDP305, 3 rounds, step 10, 2 x 4 GPUs")
    assert ESTIMATE.search("An estimate: ...") and ESTIMATE.search("estimated from the specification")
    assert not ESTIMATE.search("the overhead was underestimated") and not ESTIMATE.search("overestimates")


def test_every_figure_a_page_states_is_read_from_a_kept_run_or_called_an_estimate():
    for page, figures in traced().items():
        text = SAMPLE_REPORT.sub("", KEPT_REGION.sub("", page.read_text()))
        missing = []
        for figure in figures:  # as the page says it, wherever its lines break
            text, found = re.subn(r"\s+".join(map(re.escape, figure.split())), "", text)
            missing += [] if found else [figure]
        assert not missing, f"{page.relative_to(ROOT)} no longer says (or says otherwise): {missing}"
        # a paragraph, a list's item or a table's row that calls itself an estimate may give figures
        # no run kept
        units = [unit for p in re.split(r"\n\s*\n", text) for unit in re.split(r"\n(?=\||- )", p)]
        untraced = [m.group(0) for u in units if not ESTIMATE.search(u) for m in FIGURE.finditer(u)]
        assert not untraced, (
            f"{page.relative_to(ROOT)}: figures no run kept, and not called estimates: {untraced}"
        )


def test_the_notebooks_time_is_the_range_of_its_kept_runs():
    # its first cell says how long a default run takes: the range of benchmarks/notebook_time.py's
    # kept runs, to the minute, on the machines they ran on (each of them 2-core); and
    # its prose gives no figure besides

    runs = kept("benchmarks/notebook_time.kept.json")["runs"]
    seconds = [run["seconds"] for run in runs]
    cores = {run["machine"].partition("-core")[0] for run in runs}
    assert len(runs) >= 2 and len(cores) == 1, runs
    low, high = round(min(seconds) / 60), round(max(seconds) / 60)
    said = f"Its kept runs took {low} to {high} minutes on a {cores.pop()}-core laptop"
    cells = json.loads((ROOT / "walkthrough.ipynb").read_text())["cells"]
    prose = [" ".join("".join(cell["source"]).split()) for cell in cells if cell["cell_type"] == "markdown"]
    assert said in prose[0], f"the notebook's first cell no longer says: {said}"
    untraced = [m.group(0) for text in prose for m in FIGURE.finditer(text.replace(said, ""))]
    assert not untraced, f"the notebook's figures no run kept: {untraced}"
