"""The watcher's wrappers, one module an area: launch.py (who a process is, the group, processes of the
script's own: DDP steps 1 and 8), data.py (DataLoaders, samplers: step 3), model.py (DDP, FSDP, the
optimizer, compile: step 4), collectives.py (the script's own collectives: steps 5, 6, 9), files.py
(checkpoints and every file written: step 6), ending.py (a crash, and the end's record); and what they
share: the registry of what is wrapped, the frames (whose code is calling), the recorder, evidence."""
