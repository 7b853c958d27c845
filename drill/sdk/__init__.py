"""What a training script imports: light on purpose (no SQLAlchemy, boto3, typer or rich).

Resuming through drill — a verified ``dcp.load`` that records the resume as a drill:

    state = {"model": model, "optimizer": optimizer, ...}   # what dcp.load would take
    drill.sdk.load(state, checkpoint_id=ckpt_dir)            # raises CheckpointCorrupt on damage
    # fall back: drill.sdk.last_good(run_dir, before=ckpt_dir)

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

from drill.integrity.keys import load_key
from drill.integrity.manifest import SealConflict, SealResult, seal
from drill.errors import StorageProblem
from drill.sdk.resume import CheckpointCorrupt, LoadReport, last_good, load, verified
from drill.runlog.runfiles import read_run_file
from drill.runlog.steplog import STEP_LOG, StepLog, StepRecord, read_step_log

__all__ = ["STEP_LOG", "CheckpointCorrupt", "LoadReport", "SealConflict", "SealResult", "StepLog", "StepRecord", "StorageProblem", "last_good", "load", "load_key", "read_run_file", "read_step_log", "seal", "verified"]
