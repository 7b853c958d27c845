"""The replay's child process: build the objects, load the checkpoint, run K steps.

It runs in its own isolated interpreter (see :mod:`drill.proc`) so that a hang can be killed
at the timeout, a crash cannot take drill down, and the device memory it used is freed when
it exits. It talks to the parent through one pipe, in JSON: ``["restored"]``, ``["step",
record]``…, ``["done"]``, ``["refused", why]`` or ``["error", traceback]``.

In a replay by several ranks each child is one rank of a process group (gloo on CPU, NCCL on
GPUs) that meets in a store its parent hosts: the target builds its parallel training
objects (DDP, FSDP2) in it, the checkpoint loads through DCP across the group, and each step
sends ``["step", rank_record, run_record]`` — what this rank saw, and the run's global view
(None when the target gives only one). Before a DCP load each child sends ``["keys", missing,
untaken]``: the keys its objects ask for that the checkpoint lacks, and those it holds that
they do not take.

An entrypoint the run directory names (``run.json``) is imported only if its code lies
outside the run directory and the checkpoint; one the user or policy names is trusted.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
import traceback
from typing import Any

from drill.proc import inside
from drill.replay.spec import entrypoint_file


class Refused(Exception):
    pass


def _top(entrypoint: str) -> str:
    return entrypoint.rpartition(":")[0].split(".")[0]


def _in_run_dir(top: str, run_dir: str) -> str | None:
    for candidate in (os.path.join(run_dir, f"{top}.py"), os.path.join(run_dir, top)):
        if os.path.exists(candidate):
            return candidate
    return None


def check_origin(entrypoint: str, untrusted: tuple[str, ...]) -> None:
    """Refuse an implicit entrypoint (one the run names) whose code lives in an untrusted
    directory, without executing any of it (the path finder only looks at files)."""
    file = entrypoint_file(entrypoint)
    if file is not None:
        _refuse_inside(entrypoint, file, untrusted)
        return
    top = _top(entrypoint)
    spec = importlib.machinery.PathFinder.find_spec(top)
    places = ([spec.origin] if spec and spec.origin else []) + list(
        (spec.submodule_search_locations or []) if spec else []
    )
    if spec is None and (planted := _in_run_dir(top, untrusted[0])):
        places = [planted]
    for place in places:
        if place:
            _refuse_inside(entrypoint, place, untrusted)


def _refuse_inside(entrypoint: str, place: str, untrusted: tuple[str, ...]) -> None:
    if inside(place, untrusted):
        raise Refused(
            f"the run names replay entrypoint {entrypoint}, whose code is at {place}, inside the run directory "
            "or checkpoint: drill does not run code from a checkpoint unless you name it explicitly"
        )


def trust_explicit(entrypoint: str, run_dir: str) -> None:
    """An entrypoint the user or policy named may live in the run directory: the directory
    goes *last* on the import path, so it cannot shadow anything installed."""
    if entrypoint_file(entrypoint) is not None:
        return  # imported from where it lies (resolve_entrypoint)
    top = _top(entrypoint)
    if importlib.machinery.PathFinder.find_spec(top) is None and _in_run_dir(top, run_dir):
        sys.path.append(run_dir)


def resolve_entrypoint(spec: str) -> Any:
    module, _, name = spec.rpartition(":")
    file = entrypoint_file(spec)
    obj: Any = _import_file(file) if file is not None else importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _import_file(path: str) -> Any:
    """A module from a file named directly. Its directory goes *last* on the import path (its
    sibling modules import; nothing installed is shadowed), and the module is registered under
    its file's stem so that its classes have a name."""
    import importlib.util

    directory, stem = os.path.dirname(os.path.abspath(path)), os.path.splitext(os.path.basename(path))[0]
    if directory not in sys.path:
        sys.path.append(directory)
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return module


def main(
    conn: Any,
    entrypoint: str,
    trust: str,
    run_dir: str,
    checkpoint: str,
    device: str,
    steps: int,
    options: dict[str, Any],
    world: dict[str, Any] | None = None,
) -> None:
    # stdout belongs to the parent's --json document: the trainer's prints go to stderr.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Deterministic cuBLAS needs its workspace fixed before CUDA initializes.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        local = "://" not in run_dir
        if trust == "explicit" and local:
            trust_explicit(entrypoint, run_dir)
        elif local:
            check_origin(entrypoint, (run_dir, checkpoint))
        _replay(conn, entrypoint, run_dir, checkpoint, device, steps, options, world)
    except Refused as exc:
        _send(conn, "refused", str(exc))
    except BaseException:  # noqa: BLE001 - the traceback is the evidence
        _send(conn, "error", traceback.format_exc())
    finally:
        conn.close()


def _send(conn: Any, kind: str, *payload: Any) -> None:
    conn.send_bytes(json.dumps([kind, *payload]).encode())


def _replay(
    conn: Any,
    entrypoint: str,
    run_dir: str,
    checkpoint: str,
    device: str,
    steps: int,
    options: dict[str, Any],
    world: dict[str, Any] | None,
) -> None:
    import torch

    from drill.formats.dcp_reader import load_into
    from drill.storage import storage_for, use_options

    use_options(options)
    dev = torch.device(device)
    if world is not None:
        dev = _join(world, dev)
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
        tell = lambda match: _send(conn, "keys", match.missing, match.untaken)  # noqa: E731
        load_into(
            storage_for(checkpoint, options), checkpoint, target.stateful(), distributed=world is not None, on_keys=tell
        )
    _send(conn, "restored")
    for _ in range(steps):
        record = target.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if world is None:
            _send(conn, "step", _plain(record))
        else:
            mine, run = record if isinstance(record, tuple) else (record, None)
            _send(conn, "step", _plain(mine), None if run is None else _plain(run))
    if world is not None:
        import torch.distributed as dist

        dist.barrier()  # no rank tears the group down while a peer still talks to it
        dist.destroy_process_group()
    _send(conn, "done")


def _join(world: dict[str, Any], dev: Any) -> Any:
    """Join the replay's process group as ``world["rank"]`` of ``world["size"]``, meeting in
    ``world["store"]`` (``tcp://host:port`` or ``file:///path``) under ``world["prefix"]``; the
    device this rank replays on (rank r of a GPU replay takes its host's GPU r mod their count)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, size = int(world["rank"]), int(world["size"])
    wait = timedelta(seconds=float(world["timeout"]))
    where = str(world["store"])
    if where.startswith("file://"):
        store: Any = dist.FileStore(where[len("file://") :], -1)
        store.set_timeout(wait)
    else:
        host, _, port = where.removeprefix("tcp://").rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=wait)
    if world.get("prefix"):
        store = dist.PrefixStore(str(world["prefix"]), store)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=wait)
    return dev


def _plain(record: Any) -> dict[str, Any]:
    """A step record as plain JSON fields (whatever the target returned, a StepRecord or alike)."""
    fields = ("step", "loss", "grad_norm", "batch", "lr", "tokens")
    get = record.get if isinstance(record, dict) else (lambda k: getattr(record, k, None))
    out = {k: get(k) for k in fields}
    for k in ("loss", "grad_norm", "lr"):
        value = out[k]
        out[k] = None if value is None else float(value)
    if out["step"] is None:
        raise ValueError("the replay target's step() returned a record without a step")
    out["step"] = int(out["step"])
    return {k: v for k, v in out.items() if v is not None or k == "loss"}


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    fd, entry, trust, run, ckpt, dev, k, opts, *world = sys.argv[1:10]
    main(
        Connection(int(fd), readable=False), entry, trust, run, ckpt, dev, int(k), json.loads(opts),
        json.loads(world[0]) if world else None,
    )  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the verdict is sent: tearing torch's modules down would only hold the drill up
