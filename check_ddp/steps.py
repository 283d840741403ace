"""The ten DDP steps, as README.md names them, and the pitfall programs that show each mistake: the
words the judge and the report share."""

SCRIPT = 0  # the line of the script's own error, which is no DDP step's (DDP000), after the steps


STEPS = {  # the names of README.md's table of steps
    1: "init the process group",
    2: "place each process on its device",
    3: "shard the data",
    4: "wrap the model",
    5: "all-reduce the metrics",
    6: "checkpoint on rank 0",
    7: "clean up",
    8: "launch with torchrun",
    9: "accumulate gradients with no_sync",
    10: "evaluate exactly",
}


PITFALLS = {  # the programs in pitfalls/, beside this file in its project, that show each mistake
    "master_port": "pitfalls/step1_hardcoded_master_port.py",
    "global_rank_device": "pitfalls/step2_global_rank_as_device.py",
    "set_epoch": "pitfalls/step3_missing_set_epoch.py",
    "uneven": "pitfalls/step3_uneven_inputs.py",
    "unseeded": "pitfalls/step3_unseeded_dataset.py",
    "compile_order": "pitfalls/step4_compile_and_ddp_order.py",
    "unused_parameter": "pitfalls/step4_unused_parameter.py",
    "metrics": "pitfalls/step5_metric_averaging.py",
    "rank_zero_collective": "pitfalls/step6_collective_on_rank_zero.py",
    "unsafe_load": "pitfalls/step6_unsafe_torch_load.py",
    "wrapped_state_dict": "pitfalls/step6_wrapped_state_dict.py",
    "notebook": "pitfalls/step8_ddp_inside_a_notebook_cell.py",
    "no_sync": "pitfalls/step9_accumulation_without_no_sync.py",
    "early_stop": "pitfalls/step10_early_stop_on_one_rank.py",
    "eval_through_ddp": "pitfalls/step10_evaluate_through_ddp_on_rank_zero.py",
    "every_rank_saves": "pitfalls/step6_every_rank_saves.py",
    "optimizer_before_shard": "pitfalls/fsdp_step4_optimizer_before_fully_shard.py",
    "full_state_dict_rank_zero": "pitfalls/fsdp_step6_full_state_dict_on_rank_zero.py",
    "sharded_state_dict": "pitfalls/fsdp_step6_sharded_state_dict_saved_by_rank_zero.py",
    "fsdp_eval_alone": "pitfalls/fsdp_step10_evaluate_on_rank_zero.py",
}
