"""What the wrappers of one process share: its recorder, and what the script did so far."""

import os

from .recorder import Beside


class Watcher:
    """What the wrappers of one process share: its recorder, and what the script did so far."""

    def __init__(self, rec):
        self.rec = rec
        self.read = set()  # the launch variables already seen read (and where)
        self.state = {  # what happened since the last optimizer step
            "backward": 0,
            "synced": 0,
            "forward": 0,
            "prepared": 0,  # DDP forwards that prepared their backward's all-reduce
            "last": None,  # whether the last DDP forward did
            "items": {},
            "step": 0,
            "evaluations": 0,
            "pass": None,  # the DataLoader pass that gave the last batch
            "in_ddp": False,  # inside the DDP model's forward
            "evaluating": False,  # in a run of forwards without gradients, since the last optimizer step
        }
        self.loaders = []  # what the watcher knows of each of the script's DataLoaders, by their id
        self.of = Beside()  # the same, for each DataLoader, its iterators, and models, by identity
        self.faults = set()  # where this file's own errors were (caught, and recorded once each)
        self.live_ddp = []  # weak references to the DDP models made
        self.sharded = []  # weak references to the models sharded (FSDP), the last one the root
        self.weights = []  # the parameters of those models, or of the first optimizer: fingerprinted at exit
        self.inputs = []  # a fingerprint of each training forward's first input, kept on its device
        self.eval_inputs = []  # the same, of each forward without gradients (up to 256)
        self.written = set()  # (file, line, how) already recorded
        # the files this rank opened to write over: what it wrote into each, as far as seen (bytes, or None
        # where not known), and those opened since the last look (see files.observe_writes)
        self.wrote, self.unseen = {}, set()
        self.sharded_saves = (
            set()
        )  # the folders of the sharded checkpoints saved (torch.distributed.checkpoint)
        self.folder = os.path.realpath(os.environ["CHECK_DDP_FOLDER"])
        self.caches = os.path.realpath(os.path.expanduser("~/.cache"))

    def models(self):
        """The DDP models alive."""
        return [m for m in (ref() for ref in self.live_ddp) if m is not None]
