"""The four hangs of pitfalls/, each run under PyTorch's own tools: what each tool prints.

    python benchmarks/hang_tools.py                                # the four, on the CPU (gloo)
    python benchmarks/hang_tools.py --keep benchmarks/hang_tools.kept.json   # docs/troubleshooting.md's,
                                                                   # which it then shows
    python benchmarks/hang_tools.py --backend nccl                 # one of them on 2 GPUs (gpu_checks.sh)

Each hang is a pitfall's own mistake, its worker run by torchrun as the pitfall runs it (2 processes,
the pitfall's short timeout, _launch.TIMEOUT_S), with one tool on:

- TORCH_DISTRIBUTED_DEBUG=DETAIL, set in the environment: before every collective, the ranks compare
  what each is about to call, and a mismatch fails at once, naming both calls. Measured with torch
  2.13 on gloo, it ends every DDP job at its wrap: DDP's constructor dies with SIGSEGV (its logger
  casts the gloo backend, which DETAIL has wrapped, to ProcessGroupGloo: logger.cpp,
  set_env_variables). So it runs twice: as a user sets it, and with DDP's logger set aside, a
  workaround for torch 2.13 here alone, which lets its check be seen.
- dist.monitored_barrier(timeout=..., wait_all_ranks=True), in place of the pitfall's dist.barrier():
  rank 0 names each rank that did not come to it in time (gloo only).
- The Flight Recorder: TORCH_FR_BUFFER_SIZE=2000 keeps each rank's last collectives, with their Python
  stacks (for gloo too, in torch 2.13). nccl's watchdog dumps them when a collective times out; gloo
  has no watchdog, so each rank here dumps its own when its collective fails, as a script of yours
  would (dump_flight_recorder, below), to TORCH_FR_DUMP_TEMP_FILE<rank>. torch's analyser,
  `python -m torch.distributed.flight_recorder.fr_trace FOLDER` (or torchfrtrace), then lines the
  ranks' dumps up and names the first collective that differs.

It prints, for each hang, what each tool said (the lines that answer, not the tracebacks), and keeps
it with --keep; docs/troubleshooting.md shows the kept run. No test asserts a time.
"""

import argparse
import os
import pickle
import platform
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "pitfalls"))
from _launch import TIMEOUT_S  # noqa: E402  (the timeout each pitfall gives its process group)

HANGS = {  # name: what it is, the pitfall, the arguments its worker takes ({tmp}: a folder of its own)
    "collective_on_rank_zero": (
        "a collective on rank 0 alone",
        "step6_collective_on_rank_zero.py",
        ["mistake", "{tmp}"],
    ),
    "early_stop": ("an early stop on one rank", "step10_early_stop_on_one_rank.py", ["mistake"]),
    "evaluate_through_ddp": (
        "a last evaluation through the DDP model, on rank 0 alone",
        "step10_evaluate_through_ddp_on_rank_zero.py",
        ["mistake"],
    ),
    "uneven_inputs": ("uneven inputs", "step3_uneven_inputs.py", ["worker"]),
}
TOOLS = ("DETAIL", "check", "monitored_barrier", "flight_recorder")


# -----------------------------------------------------------------------------
# in each process of a job, started by torchrun: the tool, then the pitfall's own worker


def dump_flight_recorder():
    """Write this rank's Flight Recorder buffer to TORCH_FR_DUMP_TEMP_FILE<rank>, as nccl's watchdog
    does on a timeout: on gloo, a script calls it itself, where a collective failed. A workaround for
    torch 2.13, too: gloo records its group's ranks before the group has its name (ProcessGroupGloo is
    built before its options get group_name, in distributed_c10d.py), so the dump's pg_config names the
    group "" where its entries name it "0", and the analyser fails (KeyError: ('0', 0)). The dump
    gets the name its entries carry."""
    import torch
    import torch.distributed as dist

    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    for entry in dump["entries"]:
        name, desc = entry["process_group"]
        if "" in dump["pg_config"] and name not in dump["pg_config"]:
            dump["pg_config"][name] = {**dump["pg_config"].pop(""), "name": name, "desc": desc}
    with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{dist.get_rank()}", "wb") as f:
        pickle.dump(dump, f)


def as_worker(tool, pitfall, *args):
    """One process of a job: the tool on, then the pitfall's worker (pitfall ARGS, as its main() runs it)."""
    import torch
    import torch.distributed as dist

    sys.argv = [pitfall, *args]
    sys.path.insert(0, str(Path(pitfall).parent))  # its _launch.py
    if tool == "check":  # torch 2.13: DDP's logger crashes under DETAIL on gloo (see the docstring)
        torch._C._distributed_c10d.Logger.set_construction_data_and_log = lambda *_, **__: None
    if tool == "monitored_barrier":  # what the user writes in place of dist.barrier()
        side = {}
        init = dist.init_process_group

        def init_process_group(*args, **kwargs):
            init(*args, **kwargs)
            if dist.get_backend() != "gloo":  # monitored_barrier is gloo's: a gloo group beside nccl's
                side["group"] = dist.new_group(backend="gloo")

        def monitored_barrier(*_, **__):
            timeout = timedelta(seconds=TIMEOUT_S)
            dist.monitored_barrier(group=side.get("group"), timeout=timeout, wait_all_ranks=True)

        dist.init_process_group, dist.barrier = init_process_group, monitored_barrier
    if tool != "flight_recorder":
        runpy.run_path(pitfall, run_name="__main__")
        return
    # torchrun stops the other ranks once one has failed: each still dumps, once its own call returns
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by torchrun"))
    try:
        runpy.run_path(pitfall, run_name="__main__")
    except BaseException:
        if dist.is_initialized() and dist.get_backend() == "gloo":  # nccl's watchdog dumps its own
            dump_flight_recorder()
        raise


# -----------------------------------------------------------------------------
# the jobs, and what each tool printed


def job(hang, tool, backend, folder):
    """Run one hang under one tool: torchrun, 2 processes; return what it printed, and its dumps."""
    what, pitfall, args = HANGS[hang]
    work = Path(tempfile.mkdtemp(prefix=f"{hang}-{tool}-", dir=folder))
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crash in C++ prints each rank's Python stack
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""
        script = str(ROOT / "pitfalls" / pitfall)
    else:
        script = str(Path(__file__).resolve())  # nccl_worker, below: the same mistake, on GPUs
        args = ["nccl", hang]
    if tool in ("DETAIL", "check"):
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if tool == "flight_recorder":  # nccl: its watchdog dumps when a collective times out
        (work / "fr").mkdir()
        env |= {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(work / "fr" / "rank_")}
        env |= {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"} if backend == "nccl" else {}
    # each rank's output to a file of its own (--redirects 3): two ranks' crash reports, written at once
    # to one pipe, interleave
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    torchrun += ["--log-dir", str(work / "logs"), "--redirects", "3"]
    command = [*torchrun, str(Path(__file__).resolve()), "--as-worker", tool, script]
    command += [arg.replace("{tmp}", str(work)) for arg in args]
    try:
        proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=180)
        said = proc.stdout + proc.stderr
        for rank in (0, 1):  # then each rank's, whole
            for log in sorted((work / "logs").glob(f"*/attempt_0/{rank}/std*.log")):
                said += f"\n{log.read_text()}"
    except subprocess.TimeoutExpired as stopped:  # a hang the tools did not end: said so, never waited on
        said = f"{stopped.stdout or ''}{stopped.stderr or ''}\nhang_tools: still running after 180 s, stopped"
    analysed = ""
    if tool == "flight_recorder":
        dumps = sorted((work / "fr").glob("rank_*"))
        if dumps:
            fr_trace = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(work / "fr")]
            done = subprocess.run(fr_trace, capture_output=True, text=True, timeout=120)
            analysed = done.stdout + done.stderr
        last = {int(p.name[5:]): pickle.loads(p.read_bytes())["entries"][-1:] for p in dumps}
    else:
        last = {}
    (work / "output.txt").write_text(f"$ {' '.join(command)}\n{said}\n$ fr_trace\n{analysed}")
    return said, analysed, last


def source_line(path, number):
    lines = Path(path).read_text().splitlines()
    return lines[number - 1].strip().split("  #")[0] if 0 < number <= len(lines) else "?"


def where_in(pitfall, frames):
    """`file:line source` of the innermost frame in the pitfall, of (filename, line) frames, innermost
    first; "" if none is."""
    for filename, line in frames:
        if Path(filename).name == pitfall:
            return f"{pitfall}:{line} `{source_line(ROOT / 'pitfalls' / pitfall, line)}`"
    return ""


def first_error(said, rank):
    """A rank's first line naming an error, without gloo's source path."""
    found = re.search(rf"^\[rank{rank}\]: (\w+(?:Error|Exception): .*)$", said, flags=re.M)
    return re.sub(r"\[/\S+\] ", "", found.group(1)).split(" This is typically")[0] if found else ""


def segfaults(said, pitfall):
    """The ranks a signal ended: {rank: exit code} from torchrun's report; the errors faulthandler
    printed; and where in the pitfall it says each was (its stacks, innermost first)."""
    codes = re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-\d+)", said)
    stacks = said.split("Fatal Python error: ")[1:]  # each crash's (two ranks' may interleave)
    kinds = [m[0] for m in (re.match(r"[A-Z][\w ]*\w", stack) for stack in stacks) if m]
    # faulthandler's frames, innermost first: where the pitfall's code called into torch
    frames = re.findall(r'^  File "(.+?)", line (\d+) in \S+$', said, flags=re.M)
    where = sorted(
        {
            where_in(pitfall, [(name, int(line))])
            for (name, line), (inner, _) in zip(frames[1:], frames, strict=False)
            if Path(name).name == pitfall and Path(inner).name != pitfall and "frozen" not in inner
        }
        - {""}
    )
    return {int(r): int(c) for r, c in codes}, kinds, where


def without(text, opening):
    """text less each `opening...)` in it, its parentheses balanced (a tensor's long TensorOptions(...))."""
    while (at := text.find(opening)) != -1:
        depth, end = 0, at + len(opening) - 1
        for end in range(at + len(opening) - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:at] + text[end + 1 :]
    return text


def report(hang, tool, said, analysed, last, backend):
    """What a tool said of a hang: the lines to print, and its gist (what a live run must say again)."""
    _, pitfall, _ = HANGS[hang]
    if tool == "DETAIL":
        codes, kinds, where = segfaults(said, pitfall)
        if kinds or any(code < 0 for code in codes.values()):
            kinds = kinds or ["ended by a signal"]
            gist = f"{', '.join(sorted(set(kinds)))} in DDP's constructor, at {where}"
            codes, where = dict(sorted(codes.items())), "; ".join(where)
            return [
                f"TORCH_DISTRIBUTED_DEBUG=DETAIL: exit codes {codes} (torchrun's report); faulthandler,"
                f" on {len(kinds)} ranks: {kinds[0]}, in DDP's constructor, at {where}"
            ], gist
        tool = "check"  # no crash (nccl, or a torch that has fixed it): what the check said
    if tool == "check":
        lines, gist = [], []
        for rank in (0, 1):
            found = re.search(
                rf"^\[rank{rank}\]: \w+Error: Detected mismatch between collectives on ranks\. "
                r"(.*?)(?:\.Collectives differ|$)",
                said,
                flags=re.M,
            )
            if found:
                text = without(found[1], ", TensorDeviceTypes=TensorOptions(")
                lines.append(f"  [rank{rank}]: {text}")
                own = re.search(
                    rf"Rank {rank} is running collective: CollectiveFingerPrint\(.*?OpType=(\w+)", text
                )
                gist.append(f"rank {rank}: {own[1] if own else '?'}")
            else:
                lines.append(f"  [rank{rank}]: {first_error(said, rank) or 'no error printed'}")
                gist.append(f"rank {rank}: no mismatch")
        head = "DETAIL's check" + (
            ", DDP's logger set aside (torch 2.13 on gloo)" if backend == "gloo" else ""
        )
        return [f"{head}: each rank's 'Detected mismatch between collectives on ranks.':", *lines], "; ".join(
            gist
        )
    if tool == "monitored_barrier":
        lines, gist = [], []
        for rank in (0, 1):
            error = first_error(said, rank)
            lines.append(f"  [rank{rank}]: {error or 'no error printed'}")
            named = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", error)
            reached = re.search(r"Rank \d+ successfully reached monitoredBarrier", error)
            gist.append(
                f"rank {rank}: "
                + (
                    f"names rank {named[1]}"
                    if named
                    else "reached it, rank 0 never answered"
                    if reached
                    else "no name"
                )
            )
        return ["dist.monitored_barrier, in place of the pitfall's dist.barrier():", *lines], "; ".join(gist)
    # the Flight Recorder: the analyser's verdict on the first mismatch (it names each, in order), the
    # line it was called from, and where each rank's last collective was called
    blocks = re.split(r"(?=^(?:Collective sequence number|Not all ranks joining))", analysed, flags=re.M)
    block = blocks[1] if len(blocks) > 1 else ""
    verdict = [
        line.strip()
        for line in block.splitlines()
        if re.match(r"\s*(Collective sequence number: \d+ has errors|collective: |error msg: )", line)
    ]
    stack = [
        re.match(r"\s*(\w+) at (\S+):(\d+)", line) for line in block.split("stack trace:")[-1].splitlines()
    ]
    called = where_in(pitfall, [(m[2], int(m[3])) for m in stack if m]) if block else ""
    lines = ["Flight Recorder, its dumps analysed by torch.distributed.flight_recorder.fr_trace:"]
    lines += [f"  {line}" for line in verdict] or [
        "  no mismatch named: " + (analysed.strip().splitlines() or ["no dump"])[-1]
    ]
    if called:
        lines.append(f"  called at {called}")
    gist = [re.sub(r"\d+", "N", line) for line in verdict if line.startswith("error msg")]
    for rank, entries in sorted(last.items()):
        for entry in entries:
            frames = [(f["filename"], f["line"]) for f in entry.get("frames", [])]
            at = where_in(pitfall, frames) or "?"
            lines.append(
                f"  rank {rank}'s last collective: {entry['profiling_name']} ({entry['state']}), at {at}"
            )
            gist.append(f"rank {rank}: {entry['profiling_name']}")
    return lines, "; ".join(gist)


# -----------------------------------------------------------------------------
# on nccl: the same mistake as step6_collective_on_rank_zero.py, its tensors on this rank's GPU


def nccl_worker(hang):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert hang == "collective_on_rank_zero", hang
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=TIMEOUT_S), device_id=device)
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank its own batches
    model = DDP(torch.nn.Linear(4, 1).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(8, 4, device=device)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            torch.save(model.module.state_dict(), os.devnull)
            dist.barrier()  # the collective inside `if rank == 0:`, reached by rank 0 alone
        torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default="gloo", help="default: gloo, on the CPU"
    )
    parser.add_argument("--hangs", nargs="+", choices=list(HANGS), help="default: all four (nccl: the first)")
    parser.add_argument(
        "--keep", metavar="FILE", help="also write the output, date, machine and load to FILE (JSON)"
    )
    parser.add_argument("--all-output", metavar="FOLDER", help="keep each job's whole output in FOLDER")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from environment import Kept, describe

    hangs = args.hangs or (list(HANGS) if args.backend == "gloo" else ["collective_on_rank_zero"])
    if args.backend == "nccl":
        import torch

        if (gpus := torch.cuda.device_count()) < 2:
            sys.exit(
                f"hang_tools: nccl puts each rank on a GPU of its own: 2 are needed, {gpus} here; nothing ran"
            )
        if args.hangs and args.hangs != ["collective_on_rank_zero"]:
            parser.error("on nccl, collective_on_rank_zero is the one hang written for GPUs")
    out = Kept(args.keep)
    out.say(
        f"hang_tools: each hang a pitfall's mistake, under each tool; {args.backend}, 2 processes,"
        f" a {TIMEOUT_S} s timeout"
    )
    folder = args.all_output or tempfile.mkdtemp(prefix="hang_tools-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    runs = [(hang, tool) for hang in hangs for tool in TOOLS]
    with ThreadPoolExecutor(max_workers=4) as pool:  # the jobs mostly wait (for start-up, for the timeout)
        done = dict(zip(runs, pool.map(lambda run: job(*run, args.backend, folder), runs), strict=True))
    sections, gists = {}, {}
    for hang in hangs:
        what, pitfall, _ = HANGS[hang]
        lines = [f"== {what}: pitfalls/{pitfall}"]
        gists[hang] = {}
        for tool in TOOLS:
            if args.backend == "nccl" and tool == "check":
                continue  # DETAIL itself checks on nccl
            said, gist = report(hang, tool, *done[hang, tool], args.backend)
            lines += said
            gists[hang][tool] = gist
        sections[hang] = "\n".join(lines)
        out.say(sections[hang])
    if not args.all_output:
        shutil.rmtree(folder)
    machine = f"{os.cpu_count()}-core {platform.machine()} CPU, gloo" if args.backend == "gloo" else None
    if machine is None:
        facts = describe()
        machine = f"{facts.get('gpus')} x {facts.get('gpu 0', 'GPU').split(',')[0]}, nccl"
    out.save(machine, timeout_s=TIMEOUT_S, backend=args.backend, sections=sections, gists=gists)
    if args.keep and args.backend == "gloo" and set(hangs) == set(HANGS):
        write_page(Path(args.keep))


PAGE = ROOT / "docs/troubleshooting.md"


def write_page(kept):
    """Put a kept run into docs/troubleshooting.md: each hang's section into its region, and the
    sentence that says when, on what machine and under what load it ran."""
    import json

    record = json.loads(kept.read_text())
    name = kept.resolve().relative_to(ROOT)
    text = PAGE.read_text()
    for hang, section in record["sections"].items():
        region = re.compile(
            rf"(<!-- kept: {re.escape(str(name))}#{hang} -->\n```text\n).*?(```\n<!-- end kept -->)", re.S
        )
        text, found = region.subn(lambda m, shown=section: m[1] + shown + "\n" + m[2], text)
        assert found == 1, f"{PAGE.name} has no region for {name}#{hang}"
    load = record["load_average"]
    where = (
        f"on {record['date'][:10]}, {record['machine']}, load average {load['start']:.1f} at the start and "
        f"{load['end']:.1f} at the end"
    )
    text, found = re.subn(
        r"(it kept these runs with `--keep` )(?:on .*?at the end|on KEPT_WHERE)",
        lambda m: m[1] + where,
        text,
        flags=re.S,
    )
    assert found == 1, f"{PAGE.name} no longer says where its kept run ran"
    PAGE.write_text(text)
    print(f"hang_tools: {PAGE.relative_to(ROOT)} shows it")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-worker"]:  # torchrun's processes: hang_tools.py --as-worker TOOL SCRIPT ARGS
        as_worker(*sys.argv[2:])
    elif sys.argv[1:2] == ["nccl"]:  # the nccl hang, as the script run by as_worker
        nccl_worker(sys.argv[2])
    else:
        main()
