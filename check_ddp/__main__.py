"""python -m check_ddp my_train.py [its args]: the same as python check_ddp.py."""

import sys

from .cli import main

sys.exit(main())
