"""The replay's child process: build the objects, load the checkpoint, run K steps.

It runs in its own process (``python -m drill.replay.child``) so that a hang can be killed at the timeout, a crash
cannot take drill down, and the device memory it used is freed when it exits. It talks to
the parent through one pipe: ``("restored", t)``, ``("step", record, t)``…, ``("done",)``
or ``("error", traceback)``.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from typing import Any


def resolve_entrypoint(spec: str) -> Any:
    module, _, name = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def main(conn: Any, entrypoint: str, run_dir: str, checkpoint: str, device: str, steps: int) -> None:
    # stdout belongs to the parent's --json document: the trainer's prints go to stderr.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Deterministic cuBLAS needs its workspace fixed before CUDA initializes.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch

        from drill.restore.dcp import load_into
        from drill.storage import storage_for

        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        target = resolve_entrypoint(entrypoint)(run_dir=run_dir, checkpoint=checkpoint, device=dev)
        threads = getattr(target, "threads", None)
        if threads:
            torch.set_num_threads(int(threads))
        torch.use_deterministic_algorithms(True)
        if hasattr(target, "restore"):  # a target that loads its own (non-DCP) checkpoint
            target.restore(checkpoint)
        else:
            load_into(storage_for(checkpoint), checkpoint, target.stateful())
        conn.send(("restored", time.perf_counter()))
        for _ in range(steps):
            record = target.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            conn.send(("step", record, time.perf_counter()))
        conn.send(("done",))
    except BaseException:  # noqa: BLE001 - the traceback is the evidence
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    fd, entry, run, ckpt, dev, k = sys.argv[1:7]
    main(Connection(int(fd), readable=False), entry, run, ckpt, dev, int(k))
