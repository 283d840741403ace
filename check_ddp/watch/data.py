"""DDP step 3: each DataLoader, its dataset and sampler, and the indices of every batch."""

from .evidence import (
    attribute,
    dataset_fingerprint,
    fingerprint,
    grad_enabled,
    is_torchs,
    length_of,
    stored_length,
)
from .frames import called_by_user, where
from .recorder import Quietly
from .registry import watches


@watches("torch.utils.data.DataLoader", "__init__", step=3, label="DataLoader(...)")
def dataloader_init(original, w, _):
    from torch.utils.data import DistributedSampler

    def dataloader_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not called_by_user():
            return
        with Quietly(w):
            w.rec.add("loader", **describe_loader(w, self, DistributedSampler))

    return dataloader_init


def describe_loader(w, loader, DistributedSampler):
    """A DataLoader the script made, read without calling anything of the script's: its samplers are
    read as stored, and a length is asked only of torch's own samplers (whose length torch asks itself
    as the loader goes), never of a sampler of the script's, which may have none (an infinite one)."""
    info = w.of.set(loader, {"id": len(w.loaders), "indices": None, "passes": 0, "pass": None})
    w.loaders.append(info)
    batch_sampler, sampler = attribute(loader, "batch_sampler"), attribute(loader, "sampler")
    chain, current = [], batch_sampler if batch_sampler is not None else sampler
    for _ in range(4):  # BatchSampler(DistributedSampler(...)), and the like
        if current is None:
            break
        chain.append(current)
        current = attribute(current, "sampler")
    distributed = next((s for s in chain if isinstance(s, DistributedSampler)), None)
    dataset, offset = attribute(loader, "dataset"), None
    while type(dataset).__name__ == "Subset" and is_torchs(dataset):  # a Subset: the indices
        indices = [int(i) for i in dataset.indices]
        offset = indices if offset is None else [offset[i] for i in indices]
        dataset = dataset.dataset
    info["indices"] = offset
    subset = fingerprint(offset) if offset is not None else None  # which of the dataset's samples
    mapped = attribute(loader, "_dataset_kind") == 0
    torchs = mapped and chain and all(is_torchs(s) for s in chain)
    return dict(
        id=info["id"],
        at=where(),
        dataset=type(dataset).__name__,
        # a length asked only of torch's own (a TensorDataset's, or one its own samplers ask anyway), else
        # read from the data the dataset holds, as stored
        length=length_of(dataset) if torchs or (mapped and is_torchs(dataset)) else stored_length(dataset),
        batches=length_of(loader) if torchs else None,
        data=dataset_fingerprint(dataset),
        **({"subset": subset} if subset is not None else {}),
        sampler=type(sampler).__name__,
        distributed=distributed is not None
        and {
            "rank": distributed.rank,
            "num_replicas": distributed.num_replicas,
            "shuffle": distributed.shuffle,
            "drop_last": distributed.drop_last,
        },
    )


@watches("torch.utils.data.DataLoader", "__iter__", step=3, label="iter(DataLoader)")
def dataloader_iter(original, w, _):
    def dataloader_iter(self):
        info = w.of.get(self)
        if info is not None:
            with Quietly(w):
                # the pass begins before the iterator is made: with workers, torch hands them their first
                # indices (_next_index) while it makes the iterator, or resets a persistent one
                info["passes"] += 1
                info["pass"] = {"loader": info["id"], "batches": 0, "backward": 0}
                w.rec.add(
                    "pass", loader=info["id"], n=info["passes"], at=where(), grad=grad_enabled(),
                    eval=any(not m.training or not m.module.training for m in w.models()),
                )  # fmt: skip
        iterator = original(self)
        if info is not None:
            with Quietly(w):
                w.of.set(iterator, info["pass"])
        return iterator

    return dataloader_iter


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "_reset", step=3, label="iter(DataLoader)")
def dataloader_reset(original, w, _):
    def dataloader_reset(self, loader, *args, **kwargs):
        with Quietly(w):
            info = w.of.get(loader)
            if info is not None:
                w.of.set(self, info["pass"])  # the pass its loader began
        return original(self, loader, *args, **kwargs)

    return dataloader_reset


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "_next_index", step=3, label="next(DataLoader)")
def dataloader_next_index(original, w, _):
    def dataloader_next_index(self):
        index = original(self)
        with Quietly(w):
            current = w.of.get(self)
            if current is not None:
                indices = index if type(index) in (list, tuple) else [index]
                if all(type(i) is int for i in indices):  # a map-style dataset's indices
                    offset = w.loaders[current["loader"]]["indices"]
                    indices = [offset[i] for i in indices] if offset else list(indices)
                    w.rec.add("batch", loader=current["loader"], idx=indices, data=None)
        return index

    return dataloader_next_index


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "__next__", step=3, label="next(DataLoader)")
def dataloader_next(original, w, _):
    def dataloader_next(self):
        try:
            batch = original(self)
        except StopIteration:
            with Quietly(w):
                current = w.of.get(self)
                if current is not None:  # the pass is over: its batches, and the backward passes on them
                    w.rec.add(
                        "end",
                        loader=current["loader"],
                        batches=current["batches"],
                        backward=current["backward"],
                    )
            raise
        with Quietly(w):
            current = w.of.get(self)
            if current is not None:
                current["batches"] += 1
                w.state["pass"] = current
                if w.loaders[current["loader"]]["indices"] is None and self._dataset_kind == 1:  # iterable
                    w.rec.add("batch", loader=current["loader"], idx=None, data=fingerprint(batch))
        return batch

    return dataloader_next


@watches("torch.utils.data.DistributedSampler", "set_epoch", step=3, label="sampler.set_epoch()")
def sampler_set_epoch(original, w, _):
    def sampler_set_epoch(self, epoch):
        with Quietly(w):
            if called_by_user():
                w.rec.add("set_epoch", epoch=epoch, at=where())
        return original(self, epoch)

    return sampler_set_epoch


@watches("torch.distributed.algorithms.join.Join", "__init__", step=3, label="Join(...)")
def join_init(original, w, _):
    def join_init(self, *args, **kwargs):
        with Quietly(w):
            w.rec.add("join", at=where())
        return original(self, *args, **kwargs)

    return join_init
