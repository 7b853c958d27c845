"""What a training script imports: light on purpose (no SQLAlchemy, boto3, typer or rich).

    from drill.sdk import StepLog

    log = StepLog(run_dir)
    ...
    log.append(step, loss=loss.item(), grad_norm=gn, batch=batch_ids)
"""

from drill.sdk.steplog import STEP_LOG, StepLog, StepRecord, read_step_log

__all__ = ["STEP_LOG", "StepLog", "StepRecord", "read_step_log"]
