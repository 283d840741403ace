"""--explain: every code with its one-line summary, or one rule's page."""

from . import rules  # noqa: F401 (every rule, registered)
from .judge.registry import RETIRED, RULES
from .report import explain_command, pitfall_path
from .steps import PITFALLS, STEPS


def explain(code):
    """--explain: every code with its one-line summary; --explain CODE: that rule's page."""
    if not code:
        rules = sorted(RULES.values(), key=lambda r: (r.step or 99, int(r.code[3:])))  # by step, then code
        rows = [f"{r.code:<8} step {r.step or '-':<3} {r.verdict:<5} {r.doc.splitlines()[0]}" for r in rules]
        return "\n".join([f"The findings of check_ddp.py ({explain_command('CODE')} explains one):", *rows])
    rule = RULES.get(code.upper())
    if rule is None:
        return f"{code.upper()}: {RETIRED[code.upper()]}" if code.upper() in RETIRED else None
    step = f"step {rule.step}, {STEPS[rule.step]}" if rule.step else "the step the script was in"
    head = f"{rule.code} ({rule.verdict}, {step})"
    parts = [head, "", rule.doc, "", f"help: {rule.help}"]
    if rule.see:
        where = pitfall_path(rule.see) or f"{PITFALLS[rule.see]}, in the project check_ddp comes from"
        parts.append(f"see:  {where}")
    return "\n".join(parts)
