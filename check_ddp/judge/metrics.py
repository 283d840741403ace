"""The training metrics a script keeps, read from its code: what it adds up of the loss in its training
loop (a running sum, a stacked tensor of totals, a meter object, a dict of lists), where it reads that
out again (to print, log or save it), and whether a collective ever touches it on the way.

The run shows which collectives ran, but not whose numbers they carried: a tensor of totals is made
anew each epoch, divided, stacked, turned into a float or a string. The code says it: a value made
from the loss inside the loop that calls backward(), followed from name to name (an assignment, a
function that returns it, a method of the object that holds it), is the training metric; a reducing
collective (all_reduce, reduce, all_gather) given it, or given something made of it, is its
reduction. One that the script reads out and no collective ever touched is rank 0's shard's
estimate, however it is stored or read."""

import ast
from dataclasses import dataclass

REDUCERS = {"all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
            "reduce_scatter", "reduce_scatter_tensor"}  # fmt: skip
BACKWARD = {"backward"}  # loss.backward(), scaler.scale(loss).backward(), accelerator.backward(loss)


@dataclass(frozen=True)
class Metric:
    """A value the training loop adds up from the loss: where (file:line), the name that holds it, and
    where the script reads it out; whether a collective touches it (or what is made of it)."""

    at: str
    name: str
    reads: tuple
    reduced: bool
    reduced_at: tuple = ()  # the file:line of each call that gives it (or what is made of it) to a collective


def names_in(node):
    """The names an expression reads, with the dotted names it reads (self.meter, stats)."""
    found = set()
    for x in ast.walk(node):
        if isinstance(x, ast.Name):
            found.add(x.id)
        elif isinstance(x, ast.Attribute):
            text = dotted(x)
            if text:
                found.add(text)
    return found


def dotted(node):
    """self.meter for an attribute chain of names; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def holder(target):
    """The name a statement fills: x of x = / x += / x[...] = / x.add_(...) / x.update(...)."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Name):
        return target.id
    return dotted(target)


def loss_names(loop):
    """The names the loop calls backward() on (loss.backward(), scaler.scale(loss).backward(),
    accelerator.backward(loss)), with the names they are made from in the loop."""
    found = set()
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BACKWARD:
            found |= names_in(node.func.value) | set().union(*map(names_in, node.args))
    return {n for n in found if n not in ("self", "scaler", "accelerator", "torch")}


def accumulations(function):
    """The statements of a function's training loops that add up something made of the loss (or of
    what the loss is made of in the loop: the model's output, for an accuracy): (statement, the name
    it fills)."""
    found = []
    for loop in (n for n in ast.walk(function) if isinstance(n, (ast.For, ast.While))):
        losses = loss_names(loop)
        if not losses:
            continue
        assigned = [n for n in ast.walk(loop) if isinstance(n, ast.Assign)]
        inputs = batch_names(loop, assigned)
        made = set(losses)
        for node in assigned:  # logits = model(x); loss = criterion(logits, y): logits too, not y
            if {holder(t) for t in node.targets} & losses:
                made |= (names_in(node.value) & {holder(t) for a in assigned for t in a.targets}) - inputs
        for _ in range(2):  # and what is made of those: l = loss.item(), n = loss.detach()
            for node in assigned:
                if names_in(node.value) & made:
                    made |= {holder(t) for t in node.targets if holder(t)}
        for node in ast.walk(loop):
            if isinstance(node, ast.AugAssign) and names_in(node.value) & made and holder(node.target):
                found.append((node, holder(node.target)))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add_", "update", "append", "extend", "add", "copy_")
                and set().union(*map(names_in, [*node.args, *(k.value for k in node.keywords)])) & made
                and holder(node.func.value)
                and holder(node.func.value) not in made
            ):
                found.append((node, holder(node.func.value)))
    return found


def batch_names(loop, assigned):
    """The names a training loop's batch is held in: its own targets (for x, y in loader), and what is
    made of them alone (x = x.to(device), images, labels = batch): the inputs, not what the model made."""
    names = set()
    targets = [n.target for n in ast.walk(loop) if isinstance(n, ast.For)]
    for target in targets:
        names |= {x.id for x in ast.walk(target) if isinstance(x, ast.Name)}
    for _ in range(2):
        for node in assigned:
            used = {n for n in names_in(node.value) if "." not in n}
            if used and used <= names | {"device", "torch", "non_blocking", "self"}:
                names |= {x.id for t in node.targets for x in ast.walk(t) if isinstance(x, ast.Name)}
    return names


class Flow:
    """How values move in the script's files: the functions (by name) and what each returns, so that
    a metric is followed through `totals = self.train_epoch()` and `reduce_tensor(t)`."""

    def __init__(self, trees):
        self.trees = trees  # path: parsed module
        self.functions = {}
        for path, tree in trees.items():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, (path, node))

    def reducing_parameters(self):
        """{function name: the positions of its parameters a reducing collective is given, or something
        made of them in the function}; for a method, position 0 is self (its attributes reduced)."""
        found = {}
        for name, (_, node) in self.functions.items():
            params = [a.arg for a in node.args.args]
            made = {p: {p} for p in params}  # parameter: the names made of it
            for _ in range(2):
                for a in (n for n in ast.walk(node) if isinstance(n, ast.Assign)):
                    used = names_in(a.value)
                    for p, names in made.items():
                        if used & names or any(u.startswith(p + ".") for u in used):
                            names |= {holder(t) for t in a.targets if holder(t)}
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                if called(call) in REDUCERS and call.args:
                    given = names_in(call.args[0])
                    for i, p in enumerate(params):
                        if given & made[p] or any(g.startswith(p + ".") for g in given):
                            found.setdefault(name, set()).add(i)
        return found


def called(call):
    """The name of what a call calls: all_reduce of dist.all_reduce(...), f of f(...)."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def training_metrics(trees):
    """Every training metric of the script's files: a Metric each (see the module's docstring)."""
    flow = Flow(trees)
    reducing = flow.reducing_parameters()
    metrics, seen = [], set()
    for path, tree in trees.items():
        for function in (
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
        ):
            if isinstance(function, ast.Module):
                continue
            for statement, name in accumulations(function):
                if id(statement) not in seen:
                    seen.add(id(statement))
                    metrics.append(follow(flow, reducing, path, function, statement, name))
    for path, tree in trees.items():  # a flat script's loop, at the top level
        body = ast.Module([n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))], [])
        for statement, name in accumulations(body):
            if id(statement) not in seen:
                seen.add(id(statement))
                metrics.append(follow(flow, reducing, path, body, statement, name))
    return metrics


def follow(flow, reducing, path, function, statement, name):
    """The metric a training loop's statement adds up into name, followed through the function (and the
    functions that take what it returns): where it is read out, and whether it is reduced."""
    names, reduced = {name}, False
    scopes = [(path, function)]
    returned = any(
        isinstance(n, ast.Return) and n.value is not None and names_in(n.value) & names
        for n in ast.walk(function)
    )
    if returned and getattr(function, "name", None):  # x = self.train_epoch(): x holds it in the caller
        for other, tree in flow.trees.items():
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and called(node.value) == function.name
                ):
                    names |= {holder(t) for t in node.targets if holder(t)}
                    scopes.append((other, enclosing(tree, node)))
    reads, reduced_at = [], []
    for where, scope in scopes:
        for _ in range(3):  # what is made of it: t = torch.tensor([running_loss]), avg = total / n
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign) and names_in(node.value) & names:
                    names |= {holder(t) for t in node.targets if holder(t)}
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and node is not statement:
                if reduces(node, names, reducing):
                    reduced = True
                    reduced_at.append(f"{where}:{node.lineno}")
                if (where, node.lineno) != (path, statement.lineno) and reads_out(node, names):
                    reads.append(f"{where}:{node.lineno}")
    return Metric(
        f"{path}:{statement.lineno}",
        name,
        tuple(sorted(set(reads), key=by_place)),
        reduced,
        tuple(reduced_at),
    )


def reduces(call, names, reducing):
    """Whether a call gives one of names to a reducing collective, or to a function of the script's
    that does (as its argument, or as the object whose method it is)."""
    given = [names_in(a) for a in call.args]
    if called(call) in REDUCERS:
        return bool(given) and bool(given[0] & names)
    if called(call) not in reducing:
        return False
    method = isinstance(call.func, ast.Attribute)
    receiver = {dotted(call.func.value)} if method else set()
    return any(
        (method and i == 0 and receiver & names)
        or (0 <= i - method < len(given) and given[i - method] & names)
        for i in reducing[called(call)]
    )


def reads_out(call, names):
    """Whether a call reads one of names out (prints it, logs it, writes it, takes it to the host):
    given it, or a string made of it, or .item()/.tolist() of it."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("item", "tolist", "cpu", "numpy"):
        return bool(names_in(call.func.value) & names)
    if called(call) in ("float", "int", "str", "round"):
        return any(names_in(a) & names for a in call.args)
    args = [*call.args, *(k.value for k in call.keywords)]
    return any(names_in(a) & names for a in args) and called(call) not in REDUCERS


def enclosing(tree, target):
    """The innermost function of tree around a node (the module where there is none)."""
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= target.lineno <= (
            node.end_lineno or 0
        ):
            if best is tree or node.lineno > best.lineno:
                best = node
    return best


def in_loop_of(scope, statement, node):
    """Whether node sits in the same training loop as the statement that adds the metric up."""
    for loop in (n for n in ast.walk(scope) if isinstance(n, (ast.For, ast.While))):
        inside = loop.lineno <= statement.lineno <= (loop.end_lineno or 0)
        if inside and loop.lineno <= node.lineno <= (loop.end_lineno or 0) and loss_names(loop):
            innermost = all(
                not (inner.lineno <= statement.lineno <= (inner.end_lineno or 0))
                for inner in ast.walk(loop)
                if inner is not loop and isinstance(inner, (ast.For, ast.While))
            )
            if innermost:
                return True
    return False


def by_place(at):
    path, _, line = at.rpartition(":")
    return path, int(line)
