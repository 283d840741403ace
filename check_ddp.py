"""Check a DDP training script by running it: one line per DDP step, ok, warn or FAIL, with evidence.

    python check_ddp.py my_train.py                    # your script, with its own defaults
    python check_ddp.py my_train.py --epochs 2         # and with its own arguments
    python check_ddp.py --nproc 4 --silence 60 my_train.py
    python check_ddp.py --explain DDP305               # what a finding means, and what to do
    python check_ddp.py --judge /tmp/check_ddp-XXXX    # a job already run, judged again

The checker itself is the package beside this file, check_ddp/ (its __init__.py says how it is
built); `pip install .` in this project installs it with a command of its own, check-ddp.
"""

import sys

from check_ddp.cli import main

if __name__ == "__main__":
    sys.exit(main())
