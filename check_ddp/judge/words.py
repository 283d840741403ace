"""How the findings say things: ranks, counts, ordinals, an error's first sentence."""

import os
import re


def short(message):
    """An error's first sentence, without the C++ source locations torch puts in front; for an
    error that carries another process's traceback (mp.spawn's), that process's own error."""
    message = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", message or "").strip()
    lines = [line for line in message.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in message:
        lines = [line.strip() for line in lines if not line.startswith((" ", "\t"))][-1:]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # "Error(s) in loading state_dict for Net:", and what
        first += " " + lines[1].strip()
    sentence = re.match(r"(.{20,}?[.!])\s", first)  # the first sentence, where a longer text follows
    first = sentence.group(1) if sentence and len(first) > 160 else first
    return first if len(first) <= 160 else first[:157] + "..."


def inner_place(message, job):
    """The script's own file:line that raised, in a traceback carried inside an error, if any."""
    found = None
    for path, line in re.findall(r'File "([^"]+)", line (\d+)', message or ""):
        relative = os.path.relpath(path, job.cwd)
        if job.source(relative) is not None and not relative.startswith(".."):
            found = f"{relative}:{line}"
    return found


def ranks_text(ranks):
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def both(ranks):
    return "both" if len(ranks) == 2 else "all"


def by_line(at):
    path, _, line = at.rpartition(":")
    return path, int(line) if line.isdigit() else 0


def ordinal(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")
