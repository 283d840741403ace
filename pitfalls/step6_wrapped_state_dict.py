"""A pitfall of DDP step 6: saving model.state_dict() of the DDP-wrapped model.

    python pitfalls/step6_wrapped_state_dict.py

DDP holds the real model as model.module, so every key of the wrapper's state_dict
gains a "module." prefix. The checkpoint no longer loads into the bare model: not in
the single-GPU script, not for inference, not into a DDP model before it is wrapped.
"""

import gc
import sys
import tempfile

import torch
import torch.distributed as dist
from _launch import error_line, report, results, tell, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def worker(out_dir):  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    model = DDP(build_model())
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), f"{out_dir}/mistake.pt")  # the wrapper's keys: "module.0.weight", ...
        torch.save(model.module.state_dict(), f"{out_dir}/fix.pt")  # the model's own: "0.weight", ...
        tell(saved=True)
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def load_into_bare_model(path):
    """Load a checkpoint as the single-GPU script would; return its first key and the error, if any."""
    state = torch.load(path, weights_only=True)
    try:
        build_model().load_state_dict(state)
    except RuntimeError as error:
        return next(iter(state)), f"RuntimeError: {error}"
    return next(iter(state)), ""


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        results(torchrun(__file__, out_dir))
        mistake_key, mistake_error = load_into_bare_model(f"{out_dir}/mistake.pt")
        fix_key, fix_error = load_into_bare_model(f"{out_dir}/fix.pt")
    report(
        mistake="torch.save(model.state_dict(), path)  # model is the DDP wrapper",
        symptom=f'keys gain "module.": "{mistake_key}"; build_model().load_state_dict(...) fails:\n'
        + "\n".join(line.strip() for line in mistake_error.splitlines()[:3]),
        fix="torch.save(model.module.state_dict(), path)  # the model inside the wrapper",
        result=f'keys as the model has them: "{fix_key}"; it loads into the bare model'
        + (f", error {fix_error}" if fix_error else ""),
        checks={
            "the mistake's keys are prefixed": mistake_key.startswith("module."),
            "the mistake fails to load": "Missing key(s)" in mistake_error
            and error_line(mistake_error, 'Unexpected key.*"module\\.') != "",
            "the fix loads": fix_error == "" and not fix_key.startswith("module."),
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
