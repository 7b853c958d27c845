"""What a training script imports: light on purpose (no SQLAlchemy, boto3, typer or rich).

Resuming through drill — a verified ``dcp.load`` that records the resume as a drill:

    state = {"model": model, "optimizer": optimizer, ...}   # what dcp.load would take
    drill.sdk.load(state, checkpoint_id=ckpt_dir)            # raises CheckpointCorrupt on damage
    # fall back: drill.sdk.last_good(run_dir, before=ckpt_dir)

Saving sealed — every rank hashes what it writes, nothing is read back (``dcp.save`` and
``dcp.async_save``, same arguments):

    drill.sdk.save(state, checkpoint_id=ckpt_dir, key=load_key())       # or async_save(...)

Writing what drill checks:

    from drill.sdk import StepLog, seal

    log = StepLog(run_dir)
    ...
    log.append(step, loss=loss.item(), grad_norm=gn, batch=batch_fingerprint)
    ...
    dcp.save(state, checkpoint_id=ckpt_dir)   # on rank 0, after the save completes:
    seal(ckpt_dir, key=load_key())           # drill-manifest.json: sizes, xxh3-128 digests, and an
                                             # HMAC when $DRILL_SEAL_KEY_FILE names a key
"""

from drill.errors import StorageProblem
from drill.integrity.keys import load_key
from drill.integrity.manifest import SealConflict, SealResult
from drill.lazy import lazy_names
from drill.runlog.runfiles import read_run_file
from drill.runlog.steplog import STEP_LOG, StepLog, StepRecord, read_step_log
from drill.sdk.resume import CheckpointCorrupt, LoadReport, flush_records, last_good, load, verified
from drill.verifier import seal

_LAZY = {
    **dict.fromkeys(("save", "async_save", "SealingWriter", "SealReport", "SaveBusy", "sealing"), "drill.sdk.sealed"),
    **dict.fromkeys(
        ("ModelState", "OptimizerState", "PerRank", "RNGState", "TrainState", "fingerprint"), "drill.sdk.state"
    ),
}
"""Names imported on first use: they import torch, which a script that only logs steps need not."""


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "STEP_LOG", "CheckpointCorrupt", "LoadReport", "ModelState", "OptimizerState", "PerRank", "RNGState", "SaveBusy", "TrainState", "fingerprint", "SealConflict", "SealReport", "SealResult", "SealingWriter", "StepLog", "StepRecord", "StorageProblem",
    "async_save", "flush_records", "last_good", "load", "load_key", "read_run_file", "read_step_log", "save", "seal", "sealing", "verified",
]  # fmt: skip
