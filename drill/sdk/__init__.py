"""What a training script imports: light on purpose (no SQLAlchemy, boto3, typer or rich).

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
from drill.sdk.runfiles import read_run_file
from drill.sdk.steplog import STEP_LOG, StepLog, StepRecord, read_step_log

__all__ = ["STEP_LOG", "SealConflict", "SealResult", "StepLog", "StepRecord", "load_key", "read_run_file", "read_step_log", "seal"]
