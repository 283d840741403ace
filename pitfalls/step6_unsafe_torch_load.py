"""A pitfall of DDP step 6: torch.load(path, weights_only=False) on a checkpoint you did not write.

    python pitfalls/step6_unsafe_torch_load.py

A checkpoint is a pickle, and unpickling calls whatever functions the file names. With
weights_only=False, torch.load runs them: here, a harmless open(marker, "w") that
creates a file. Since torch 2.6, weights_only=True is the default, and refuses any
function it does not know; weights_only=False is what old code, or advice to "make the
error go away", still passes (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 does the same).
No processes: this one is about the file.
"""

import os
import tempfile

import torch
from _launch import error_line, report


class Payload:
    """What an attacker puts in a checkpoint: unpickling it calls open(marker, "w")."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def main():
    with tempfile.TemporaryDirectory() as folder:
        marker, path = os.path.join(folder, "marker"), os.path.join(folder, "checkpoint.pt")
        torch.save({"model_state_dict": {"weight": torch.ones(2)}, "extra": Payload(marker)}, path)

        torch.load(path, weights_only=False)  # the mistake
        code_ran = os.path.exists(marker)
        os.remove(marker)

        try:
            torch.load(path, weights_only=True)  # the fix, and torch's default since 2.6
            refused = ""
        except Exception as error:
            refused = f"{type(error).__name__}: {error}"
        code_ran_again = os.path.exists(marker)
    report(
        mistake="torch.load(path, weights_only=False)  # on a checkpoint from someone else",
        symptom="it runs the code the file names: open(marker, 'w'), and the file"
        f" {'appears' if code_ran else 'is absent'} in a temp dir",
        fix="torch.load(path, weights_only=True), the default since torch 2.6: tensors and plain data only",
        result="refused, no file created:\n"
        + error_line(refused, r"^UnpicklingError").split(" This file")[0]
        + " ...\n"
        + error_line(refused, r"Unsupported global").split(" Please use")[0],
        checks={
            "the mistake ran the file's code": code_ran,
            "the fix refused it": "Unsupported global" in refused,
            "and ran nothing": not code_ran_again,
        },
    )


if __name__ == "__main__":
    main()
