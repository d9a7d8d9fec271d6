"""Resuming to a GPU, and the first checkpoint of a process, on a lent GPU machine.

    python3 bench/gpu_resume.py --dir /local/nvme            # 16 x Linear(8192, 8192) + AdamW
    python3 bench/gpu_resume.py --device cpu --layers 2 --width 1024 --dir /tmp/x   # dry run

bench/resume.py's table with ``map_location="cuda"``: raw sequential read (``cat``), then
``torch.load``, DCP ``load``, ``Checkpointer.load_latest`` (one pass), the same as before this
change, and ``Checkpointer.load_sharded``, from checkpoint to state on the GPU of a ~1B-parameter
model with its AdamW state (12.9 GB, as bench/gpu_checkpoint.py), the page cache dropped before
each method (``posix_fadvise(DONTNEED)``), two runs. Then the time the first asynchronous save
of a process blocks, without and with ``Checkpointer.prepare(state)`` made while the loop
trains, against a steady save. Targets: load_latest <= 1.1x the raw read; the first save after
prepare blocks <= 0.3 s. The options are bench/resume.py's.
"""

from __future__ import annotations

import resume

if __name__ == "__main__":
    resume.main(defaults={"device": "cuda", "layers": 16, "width": 8192, "first_save": True})
