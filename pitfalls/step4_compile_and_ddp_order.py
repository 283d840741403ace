"""A pitfall of DDP step 4: torch.compile and DDP in the wrong order: for an nn.Sequential, nothing compiles.

    python pitfalls/step4_compile_and_ddp_order.py

torch.compile hands each graph it captures to its backend; here a counting backend, which
counts them and runs each as captured (no real compile, which would take minutes). With
torch 2.13, for a model whose forward is torch's own code, as nn.Sequential's is:
- torch.compile(DDP(model)): the compiler skips DDP's forward by design (the frames
  around it break the graph) and resumes in the frames it calls; Sequential.forward,
  in torch's own files, is skipped as such a frame too. No graph and no error; the one
  warning, "Profiler record function ... will be ignored", says nothing of it.
- model.compile(); DDP(model): model.compile() compiles the module's _call_impl, also
  torch's own, and for a Sequential it compiles nothing even without DDP
  (pytorch/pytorch#150915).
- DDP(torch.compile(model)) compiles: DDP runs the compiled module, still splitting its
  graph at gradient buckets.
With a Module of your own, whose forward is in your file, torch.compile(DDP(model))
compiles too (the order PyTorch's DDP notes show): shown as well.
DDP(torch.compile(model)) has a price: the compiled module's keys gain "_orig_mod.", so
model.module.state_dict() (the fix of step6_wrapped_state_dict.py) no longer loads into the
bare model. Save the bare model's: keep a reference to it, or model.module._orig_mod.state_dict().
"""

import gc
import sys

import torch
import torch.distributed as dist
from _launch import error_line, report, results, tell, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


class Net(torch.nn.Module):  # the same layers, in a class of your own: its forward is your code
    def __init__(self):
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.hidden(x).relu())


def compile_then_wrap(model, backend):
    model.compile(backend=backend)
    return DDP(model)


ORDERS = {  # how each order wraps a model, given the compiler's backend
    "torch.compile(DDP(model))": lambda model, backend: torch.compile(DDP(model), backend=backend),
    "model.compile(); DDP(model)": compile_then_wrap,
    "model.compile(), no DDP": lambda model, backend: model.compile(backend=backend) or model,
    "DDP(torch.compile(model))": lambda model, backend: DDP(torch.compile(model, backend=backend)),
}


def graphs_compiled(order, model):
    """Train 2 steps of model wrapped in this order; return the wrapped model and the graphs compiled."""
    torch._dynamo.reset()  # forget what earlier orders compiled
    graphs = 0

    def counting_backend(graph_module, example_inputs):
        nonlocal graphs
        graphs += 1
        return graph_module.forward  # run the graph as captured

    wrapped = ORDERS[order](model, counting_backend)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for _ in range(2):
        wrapped(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return wrapped, graphs


def load_error(state):
    """The error of loading state into the bare model, as the single-GPU script would; "" if it loads."""
    try:
        build_model().load_state_dict(state)
    except RuntimeError as error:
        return f"RuntimeError: {error}"
    return ""


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    graphs = {}
    for order in ORDERS:
        bare = build_model()
        model, graphs[order] = graphs_compiled(order, bare)
    # the last order was the fix: model = DDP(torch.compile(bare)), with a reference kept to bare
    own = graphs_compiled("torch.compile(DDP(model))", Net())[1]
    first_key = {
        "model": next(iter(model.state_dict())),
        "model.module": next(iter(model.module.state_dict())),
        "bare": next(iter(bare.state_dict())),
        "model.module._orig_mod": next(iter(model.module._orig_mod.state_dict())),
    }
    errors = {"model.module": load_error(model.module.state_dict()), "bare": load_error(bare.state_dict())}
    errors["model.module._orig_mod"] = load_error(model.module._orig_mod.state_dict())
    tell(rank=dist.get_rank(), graphs=graphs, own=own, first_key=first_key, errors=errors)
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    said = results(torchrun(__file__, "worker"))
    graphs, own, key, errors = (said[0][k] for k in ("graphs", "own", "first_key", "errors"))
    unexpected = error_line(errors["model.module"], r"Unexpected key").split(",")[0].strip()
    report(
        mistake="torch.compile(DDP(model)), or model.compile(); DDP(model)  # model = nn.Sequential(...)",
        symptom=f"the counting backend is handed {graphs['torch.compile(DDP(model))']} and"
        f" {graphs['model.compile(); DDP(model)']} graphs: the model runs uncompiled, and nothing says so\n"
        f"(model.compile() without DDP: {graphs['model.compile(), no DDP']} too;"
        f" a Module of your own in torch.compile(DDP(model)): {own})",
        fix="model = DDP(torch.compile(bare)); save bare.state_dict() or model.module._orig_mod.state_dict()",
        result=f'{graphs["DDP(torch.compile(model))"]} graph compiled. Keys: model\'s "{key["model"]}",'
        f' model.module\'s "{key["model.module"]}",\n'
        f'which does not load into the bare model ({unexpected}...);\nbare\'s "{key["bare"]}" loads',
        checks={
            "two orders compile nothing for a Sequential": graphs["torch.compile(DDP(model))"] == 0
            and graphs["model.compile(); DDP(model)"] == 0,
            "model.compile() compiles nothing for it, even without DDP": graphs["model.compile(), no DDP"]
            == 0,
            "torch.compile(DDP(model)) compiles a Module of your own": own > 0,
            "DDP(torch.compile(model)) compiles": graphs["DDP(torch.compile(model))"] > 0,
            "every rank compiled the same": all(p["graphs"] == graphs and p["own"] == own for p in said),
            "its keys carry _orig_mod.": key["model"] == "module._orig_mod.0.weight"
            and key["model.module"] == "_orig_mod.0.weight",
            "model.module's do not load": '"_orig_mod.0.weight"' in unexpected,
            "the bare model's do": key["bare"] == key["model.module._orig_mod"] == "0.weight"
            and errors["bare"] == errors["model.module._orig_mod"] == "",
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
