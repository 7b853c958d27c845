"""What a training script imports: light on purpose (no SQLAlchemy, boto3, typer or rich).

    from drill.sdk import StepLog, seal

    log = StepLog(run_dir)
    ...
    log.append(step, loss=loss.item(), grad_norm=gn, batch=batch_fingerprint)
    ...
    dcp.save(state, checkpoint_id=ckpt_dir)   # on rank 0, after the save completes:
    seal(ckpt_dir)                           # drill-manifest.json: sizes and xxh3-128 digests
"""

from drill.integrity.manifest import SealConflict, SealResult, seal
from drill.sdk.steplog import STEP_LOG, StepLog, StepRecord, read_step_log

__all__ = ["STEP_LOG", "SealConflict", "SealResult", "StepLog", "StepRecord", "read_step_log", "seal"]
