"""The script's code as evidence, for what the run does not show: a line's text, the if around a call,
what an option decides, the calls no rank reached; and the silencing comments it holds."""

import ast
import functools
import re

from .metrics import training_metrics
from .registry import RULES
from .words import by_line


class Source:
    """The script's files as the job saw them, parsed: what its code says where the run does not show
    it (a line's text, the `if` around a call, what an option decides, the calls no rank reached).
    Evidence only: what a finding makes of it is the rules'."""

    def __init__(self, job):
        self.job = job
        self._trees = {}  # the script's files, parsed

    def code(self, at):
        """The source line at file:line, short, in backquotes: the evidence a reader recognises."""
        if not at:
            return ""
        path, _, line = at.rpartition(":")
        try:
            text = self.job.source(path).splitlines()[int(line) - 1].strip()
        except (AttributeError, ValueError, IndexError):
            return at
        return f"{at} `{text if len(text) <= 70 else text[:67] + '...'}`"

    def rank_condition(self, at):
        """The `if` that tests a rank (if rank == 0:, if master_process:) and decides whether file:line
        runs, if any: one around it, or a guard before it in a block around it that leaves otherwise
        (if local_rank != 0: return). The nearest."""
        if not at:
            return None
        path, _, line = at.rpartition(":")
        source = self.job.source(path)
        try:
            tree = ast.parse(source)
        except (TypeError, SyntaxError, ValueError):
            return None
        line = int(line)
        found = None
        for node in ast.walk(tree):
            for block in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
                if not isinstance(block, list) or not any(spans(x, line) for x in block):
                    continue
                for x in block:
                    if not isinstance(x, ast.If):
                        continue
                    test = ast.get_source_segment(source, x.test) or ""
                    if not re.search(r"rank|master|main_process|is_main|leader", test, re.I):
                        continue
                    if x.lineno < line and any(spans(child, line) for child in x.body):
                        said = f"if {test}:"
                    elif spans(x, line) or x.lineno > line or x.orelse or not leaves(x.body):
                        continue
                    else:
                        said = f"if {test}: {ast.get_source_segment(source, x.body[-1])}"
                    if found is None or x.lineno > found[0]:
                        found = (x.lineno, said)
        return found and found[1]

    def tree(self, path):
        """The script's file at path, parsed (None if it cannot be)."""
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.job.source(path) or "")
            except (SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    def option_uses(self, dest):
        """Where the script uses the value of its option `dest` (args.dest, after args =
        parser.parse_args(), or a name assigned from it): (file:line, the if-test it decides or None,
        the statement's source), in every file of the script's the job has."""
        found = []
        for path in sorted(self.job.sources):
            tree = self.tree(path)
            if tree is None:
                continue
            source = self.job.source(path)
            parsed = {  # the names given parse_args()'s result
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Call, ast.Subscript))
                and re.search(r"parse(_known)?_args\(", ast.get_source_segment(source, node.value) or "")
                for target in node.targets if isinstance(target, ast.Name)
            }  # fmt: skip
            aliases = {
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and is_option(node.value, parsed, dest, set())
                for target in node.targets if isinstance(target, ast.Name)
            }  # fmt: skip
            tests = {id(node.test): node for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp))}
            for node in ast.walk(tree):
                if not is_option(node, parsed, dest, aliases):
                    continue
                test = next(
                    (t.test for t in tests.values() if any(n is node for n in ast.walk(t.test))), None
                )
                found.append((f"{path}:{node.lineno}", test, (parsed, aliases, path)))
        return found

    def default_from_local_rank(self, arg, reads):
        """Whether the option's default is read from LOCAL_RANK: the script read it (reads: where it was
        read, file:line) inside the add_argument() (or set_defaults()) call that names the option."""
        dest = arg["option"].lstrip("-").replace("-", "_")
        for path in self.job.sources:
            tree, source = self.tree(path), self.job.source(path)
            for node in ast.walk(tree) if tree else ():
                if isinstance(node, ast.Call) and re.search(
                    r"add_argument|set_defaults", ast.get_source_segment(source, node.func) or ""
                ):
                    text = ast.get_source_segment(source, node) or ""
                    if (arg["option"] in text or f"{dest}=" in text) and any(
                        f"{path}:{n}" in reads
                        for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    ):
                        return True
        return False

    def option_set(self, dest):
        """Whether the script assigns args.dest itself after parsing (args.local_rank =
        int(os.environ["LOCAL_RANK"])), where args holds parse_args()'s result."""
        for _, _, (parsed, _, path) in self.option_uses(dest):
            for node in ast.walk(self.tree(path)):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else ():
                    if isinstance(t, ast.Attribute) and t.attr == dest and is_parsed(t.value, parsed):
                        return True
        return bool(self.source_lines(rf"setattr\([^,]+,\s*['\"]{dest}['\"]"))

    def decided_guards(self, dest, value):
        """The ifs that test the option `dest` alone (with constants), which every rank, holding the
        same value, decides alike: (file:line, the test's source, True or False, the torch.save lines
        it guards), in order."""
        guards = []
        for at, test, (parsed, aliases, path) in self.option_uses(dest):
            if test is None or any(at2 == at for at2, *_ in guards):
                continue
            known = functools.partial(known_option, parsed=parsed, dest=dest, aliases=aliases, value=value)
            result = decide(test, known)
            if result is UNDECIDED:
                continue
            owner = next(
                n for n in ast.walk(self.tree(path)) if isinstance(n, (ast.If, ast.IfExp)) and n.test is test
            )
            saves = sorted(
                {
                    f"{path}:{n.lineno}"
                    for branch in (
                        (owner.body if result is False else owner.orelse) if isinstance(owner, ast.If) else []
                    )
                    for n in ast.walk(branch)
                    if isinstance(n, ast.Call)
                    and re.search(r"save", ast.get_source_segment(self.job.source(path), n.func) or "", re.I)
                },
                key=by_line,
            )
            source = self.job.source(path)
            acts = any(
                isinstance(n, ast.Call)
                and re.search(SIGNIFICANT, ast.get_source_segment(source, n.func) or "")
                for branch in ((owner.body, owner.orelse) if isinstance(owner, ast.If) else ())
                for statement in branch
                for n in ast.walk(statement)
            )
            guards.append(
                (f"{path}:{test.lineno}", ast.get_source_segment(source, test), bool(result), saves, acts)
            )
        return guards

    def assignments(self, attribute):
        """file:line of every assignment to an attribute of that name in the script's files."""
        return sorted(
            {
                f"{path}:{node.lineno}"
                for path in self.job.sources
                if self.tree(path)
                for node in ast.walk(self.tree(path))
                if isinstance(node, (ast.Assign, ast.AugAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Attribute) and t.attr == attribute
            },
            key=by_line,
        )

    def source_lines(self, pattern):
        """file:line of every line of the script's files that matches pattern, in order."""
        return [
            f"{path}:{n}"
            for path in sorted(self.job.sources)
            for n, text in enumerate((self.job.source(path) or "").splitlines(), 1)
            if re.search(pattern, text) and not text.lstrip().startswith("#")
        ]

    @functools.lru_cache(maxsize=1)  # noqa: B019 (one Source a judged job)
    def ignores(self):
        """{file:line: the codes its `# check_ddp: ignore[CODE, ...]` comment names}, in every file of the
        script's (a name that is no code is in unknown_ignores(): a mistake, never a silence)."""
        found = {}
        for path in sorted(self.job.sources):
            for n, codes in silencing(self.job.source(path) or ""):
                found[f"{path}:{n}"] = {code for code in codes if code in RULES}
        return found

    def unknown_ignores(self):
        """The silencing comments' names that are no code, in the script's files: (file:line, name)."""
        found = []
        for path in sorted(self.job.sources):
            for n, code in unknown_ignores(self.job.source(path) or ""):
                if (f"{path}:{n}", code) not in found:
                    found.append((f"{path}:{n}", code))
        return found

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one Source a judged job)
    def filled_without_gradients(self, at):
        """For the collective called at file:line: whether the tensor it is given (its first argument, a
        name) holds numbers made with gradients off: the statements that fill it, in the same function
        (past the one that makes it), or that fill the names it is made of (a stack of sums), all
        inside `with torch.no_grad():` or `torch.inference_mode()` (or a function under either), True;
        all outside, False; None where the code does not say."""
        path, _, n = at.rpartition(":")
        tree, n = self.tree(path), int(n) if n.isdigit() else 0
        call = next(
            (
                node
                for node in ast.walk(tree)
                if tree
                if isinstance(node, ast.Call)
                and node.lineno == n
                and node.args
                and isinstance(node.args[0], ast.Name)
            ),
            None,
        )
        if call is None:
            return None
        functions = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.lineno <= n <= (node.end_lineno or 0)
        ]
        scope = max(functions, key=lambda node: node.lineno, default=tree)  # the innermost
        quiet = [  # the lines that run with gradients off
            (node.lineno, node.end_lineno or node.lineno)
            for node in [*ast.walk(scope), *functions]
            if isinstance(node, ast.With)
            and any(re.search(r"no_grad|inference_mode", ast.unparse(i.context_expr)) for i in node.items)
            or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(re.search(r"no_grad|inference_mode", ast.unparse(d)) for d in node.decorator_list)
        ]

        def fills(name):
            return sorted(
                (
                    node
                    for node in ast.walk(scope)
                    if getattr(node, "lineno", n) < n and fills_name(node, name)
                ),
                key=lambda node: node.lineno,
            )

        seen, lines, names = set(), [], [call.args[0].id]
        while names:
            name = names.pop()
            if name in seen or len(seen) > 8:
                continue
            seen.add(name)
            made = fills(name)
            for node in made[1:] if len(made) > 1 else made:  # past the statement that makes it
                used = [
                    x.id
                    for x in ast.walk(getattr(node, "value", node))
                    if isinstance(x, ast.Name) and x.id != name
                ]
                made_of = [u for u in used if fills(u)]
                done_quietly = any(a <= node.lineno <= b for a, b in quiet)
                if (
                    isinstance(node, ast.Assign) and made_of and not done_quietly
                ):  # a stack of others: theirs decide
                    names += made_of
                else:
                    lines.append(node.lineno)
        if not lines:
            return None
        inside = [any(a <= line <= b for a, b in quiet) for line in lines]
        return True if all(inside) else False if not any(inside) else None

    def assigned_from(self, at):
        """The lines that give a value to the names the statement at file:line reads (name = ..., in the
        same file): where what the line uses came from, one step back. A set of file:line."""
        if not at:
            return set()
        path, _, n = at.rpartition(":")
        tree = self.tree(path)
        if tree is None or not n.isdigit():
            return set()
        used = {
            node.id
            for statement in ast.walk(tree)
            if isinstance(statement, ast.stmt) and statement.lineno == int(n)
            for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        return {
            f"{path}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and target.id in used
        }

    def divided_by_whole_set(self, at):
        """Where the script divides by len(NAME.dataset), NAME the loader made at file:line (a name or an
        attribute of that name, in any of its files): the size of the whole set the loader draws from,
        whatever share of it the loader gives a rank. file:line of each, in order."""
        path, _, n = at.rpartition(":")
        tree = self.tree(path)
        if tree is None or not n.isdigit():
            return []
        names = {
            target.id if isinstance(target, ast.Name) else target.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and node.lineno <= int(n) <= node.end_lineno
            for target in node.targets
            if isinstance(target, (ast.Name, ast.Attribute))
        }
        found = set()
        for file in self.job.sources:
            for node in ast.walk(self.tree(file) or ast.Module([], [])):
                divisor = (
                    node.right if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                    else node.value if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div)
                    else None
                )  # fmt: skip
                if divisor is not None and any(whole_set(call, names) for call in ast.walk(divisor)):
                    found.add(f"{file}:{node.lineno}")
        return sorted(found, key=by_line)

    def identifiers(self, pattern):
        """The names the script's code uses (variables, attributes, arguments, its options' names) that
        match pattern, sorted: what it calls things, not what its comments or strings say."""
        found = set()
        for path in self.job.sources:
            for node in ast.walk(self.tree(path) or ast.Module([], [])):
                name = (
                    node.id if isinstance(node, ast.Name)
                    else node.attr if isinstance(node, ast.Attribute)
                    else node.arg if isinstance(node, ast.arg)
                    else None
                )  # fmt: skip
                if name and re.search(pattern, name, re.I):
                    found.add(name)
        return sorted(found)

    def handled_in(self, tried, raised):
        """Whether the line `raised` (file:line) is in an except handler of a try whose body holds the
        line `tried`: the script's own answer to what failed there (a variable missing)."""
        path, _, a = (tried or "").rpartition(":")
        other, _, b = (raised or "").rpartition(":")
        if path != other or not a.isdigit() or not b.isdigit():
            return False
        return any(
            isinstance(node, ast.Try)
            and any(spans(statement, int(a)) for statement in node.body)
            and any(spans(handler, int(b)) for handler in node.handlers)
            for node in ast.walk(self.tree(path) or ast.Module([], []))
        )

    def loader_without_sampler(self, at):
        """Whether the line at file:line makes a DataLoader(...) given no sampler (no sampler= or
        batch_sampler=, nothing in their places, no ** that may hold one): the single-process script
        makes this same loader. False where no such call is there, or where it may be given one."""
        path, _, n = (at or "").rpartition(":")
        for node in ast.walk(self.tree(path) or ast.Module([], [])):
            if (
                isinstance(node, ast.Call)
                and spans(node, int(n))
                and ast.unparse(node.func).rpartition(".")[2] == "DataLoader"
            ):
                keywords = {k.arg for k in node.keywords}
                starred = any(isinstance(a, ast.Starred) for a in node.args)
                # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
                return not ({"sampler", "batch_sampler", None} & keywords or starred or len(node.args) > 3)
        return False

    def line(self, at):
        """The text of the line at file:line, or "" where the job has no such line."""
        path, _, n = at.rpartition(":")
        try:
            return (self.job.source(path) or "").splitlines()[int(n) - 1]
        except (ValueError, IndexError):
            return ""

    @functools.lru_cache(maxsize=1)  # noqa: B019 (one Source a judged job)
    def training_metrics(self):
        """What the script's training loops add up of the loss, where it reads that out, and whether a
        collective touches it (check_ddp.judge.metrics)."""
        return training_metrics(
            {path: tree for path in sorted(self.job.sources) if (tree := self.tree(path))}
        )

    def calls_named(self, name):
        """The calls in the script's files of a function or method of that name (spawn of mp.spawn(...)):
        (file:line, its source's first line), in order."""
        found = set()
        for path in sorted(self.job.sources):
            for node in ast.walk(self.tree(path) or ast.Module([], [])):
                if isinstance(node, ast.Call):
                    func = node.func
                    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) == name:
                        found.add((f"{path}:{node.lineno}", self.line(f"{path}:{node.lineno}").strip()))
        return sorted(found, key=lambda item: by_line(item[0]))

    def keyword_calls(self, keyword, value):
        """Each call in the script's files given keyword=value (a constant): (file:line, the name of what it
        calls: MNIST of datasets.MNIST(...)), in order."""
        found = set()
        for path in sorted(self.job.sources):
            for node in ast.walk(self.tree(path) or ast.Module([], [])):
                if isinstance(node, ast.Call) and any(
                    k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value is value
                    for k in node.keywords
                ):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    found.add((f"{path}:{node.lineno}", name))
        return sorted(found, key=lambda item: by_line(item[0]))

    def calls(self, name):
        """The calls of `name` (torch.save, torch.load) in the script's files, reached or not: (file:line,
        {keyword: its value where a constant, else UNDECIDED}), in order."""
        found = {}
        for path in sorted(self.job.sources):
            tree = self.tree(path)
            for node in ast.walk(tree) if tree else ():
                # the call's name as Python reads it (its source segment would split the file at each call)
                if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                    keywords = {
                        k.arg: k.value.value if isinstance(k.value, ast.Constant) else UNDECIDED
                        for k in node.keywords
                        if k.arg
                    }
                    found[f"{path}:{node.lineno}"] = keywords
        return sorted(found.items(), key=lambda item: by_line(item[0]))


def whole_set(node, names):
    """Whether node is len(X.dataset), X one of names (or an attribute of that name: self.val_loader)."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "len" and len(node.args) == 1):
        return False
    arg = node.args[0]
    if not (isinstance(arg, ast.Attribute) and arg.attr == "dataset"):
        return False
    owner = arg.value
    return (owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)) in names


def fills_name(node, name):
    """Whether a statement gives the name a value: name = ..., name += ..., name[...] = ..., or an in-place
    call on it (name.add_(...), name.copy_(...))."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(
            isinstance(t, ast.Name)
            and t.id == name
            or isinstance(t, ast.Subscript)
            and getattr(t.value, "id", "") == name
            for t in targets
        )
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and getattr(node.value.func.value, "id", None) == name
        and node.value.func.attr.endswith("_")
    )


def silencing(text):
    """Each line of a file whose comment silences findings: (its number, the codes it names, as written).
    Comments only, as Python reads them: not a docstring that shows how."""
    import io
    import tokenize

    try:
        comments = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError):
        comments = []
    for n, comment in comments:
        for names in re.findall(r"#\s*check_ddp:\s*ignore\[([^\]]*)\]", comment):
            yield n, [c.strip().upper() for c in names.split(",") if c.strip()]


def unknown_ignores(text):
    """The silencing comments' names that are no rule's code: (line, name)."""
    return [(n, code) for n, codes in silencing(text) for code in codes if code not in RULES]


UNDECIDED = object()  # a value the source alone does not tell


# calls whose running or not changes what the job does, not only what it prints
SIGNIFICANT = (
    r"save|init_process_group|DistributedDataParallel|DDP|barrier|all_reduce|broadcast|set_device|cuda|\.to$"
)


def known_option(node, parsed, dest, aliases, value):
    return value if is_option(node, parsed, dest, aliases) else UNDECIDED


def is_parsed(node, parsed):
    """Whether node names parse_args()'s result: args, or self.args."""
    return (isinstance(node, ast.Name) and node.id in parsed) or (
        isinstance(node, ast.Attribute) and node.attr in parsed
    )


def is_option(node, parsed, dest, aliases):
    """Whether node reads the option dest: args.dest, where args holds parse_args()'s result, or an
    alias assigned from it."""
    if isinstance(node, ast.Attribute):
        return node.attr == dest and is_parsed(node.value, parsed) and isinstance(node.ctx, ast.Load)
    return isinstance(node, ast.Name) and node.id in aliases and isinstance(node.ctx, ast.Load)


def decide(node, value_of):
    """The value of an if-test made of known values, constants, comparisons, not/and/or; UNDECIDED
    if any part is not known. value_of(node) gives a known node's value, or UNDECIDED."""
    import operator

    known = value_of(node)
    if known is not UNDECIDED:
        return known
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [decide(e, value_of) for e in node.elts]
        return UNDECIDED if any(i is UNDECIDED for i in items) else tuple(items)
    if isinstance(node, ast.UnaryOp):
        operand = decide(node.operand, value_of)
        if operand is UNDECIDED:
            return UNDECIDED
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}.get(
            type(node.op), lambda _: UNDECIDED
        )(operand)
    if isinstance(node, ast.BoolOp):
        values = [decide(v, value_of) for v in node.values]
        stop = isinstance(node.op, ast.Or)  # or: the first true decides; and: the first false
        for v in values:
            if v is UNDECIDED:
                return UNDECIDED
            if bool(v) is stop:
                return v
        return values[-1]
    if isinstance(node, ast.Compare):
        ops = {
            ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        }  # fmt: skip
        left = decide(node.left, value_of)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = decide(right_node, value_of)
            if left is UNDECIDED or right is UNDECIDED or type(op) not in ops:
                return UNDECIDED
            try:
                if not ops[type(op)](left, right):
                    return False
            except TypeError:
                return UNDECIDED
            left = right
        return True
    return UNDECIDED


def spans(node, line):
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def leaves(body):
    """Whether a block always leaves what holds it: it ends in return, raise, continue or break."""
    return isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))
