"""The rules, one module a DDP step (step3_shard.py holds step 3's), and at_the_end.py for what no
step's line accounts for. Each rule is a function under @rule(CODE, ...) whose docstring is its
explanation (check_ddp.py --explain CODE); importing a module registers its rules."""

from . import (  # noqa: F401 (each module registers its rules)
    at_the_end,
    step1_init,
    step2_device,
    step3_shard,
    step4_wrap,
    step5_metrics,
    step6_checkpoint,
    step7_clean_up,
    step8_launch,
    step9_no_sync,
    step10_evaluate,
)
