"""What the rules read, and how they are declared: the registry of rules (registry.py), the facts
derived once from a job's records (facts.py), the script's code as evidence (source.py), the evidence
several steps share (evidence.py), crashes (crash.py), and the words findings use (words.py). The rules
themselves are in check_ddp/rules/, and check_ddp/verdict.py runs them."""
