"""Reading a run directory's own small files from wherever the run lives.

A replay entrypoint gets ``run_dir`` as a string that may be a local path or ``s3://…``; it
reads its configuration through :func:`read_run_file`, which goes through drill's storage with
the drill's settings (endpoint, region, profile), so the same entrypoint replays a run from
either tier.
"""

from __future__ import annotations

DEFAULT_LIMIT = 16 << 20


def read_run_file(run_dir: str, name: str, *, limit: int = DEFAULT_LIMIT) -> bytes:
    """The bytes of ``name`` inside ``run_dir``.

    ``name`` must stay inside the run (no ``..``, no absolute path, no link out); a file larger
    than ``limit`` bytes raises ``ValueError`` rather than filling memory.
    """
    from drill.storage import storage_for

    storage = storage_for(run_dir)
    with storage.open(storage.child(run_dir, name)) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{name} in {run_dir} is larger than {limit} bytes")
    return data
