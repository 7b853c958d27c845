"""What a training run writes beside its checkpoints for drill to compare with: the step log
(``drill-steps.jsonl``: loss, grad norm, batch fingerprint per step) and ``run.json``.
Training scripts reach these through :mod:`drill.sdk`; drill's own packages import them here."""

from drill.runlog.runfiles import read_run_file
from drill.runlog.steplog import STEP_LOG, StepLog, StepRecord, parse_step_log, read_step_log

__all__ = ["STEP_LOG", "StepLog", "StepRecord", "parse_step_log", "read_step_log", "read_run_file"]
