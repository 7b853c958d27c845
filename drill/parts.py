"""Named constants for the parts of a training checkpoint.

Every format adapter presents a checkpoint as these parts (torchtitan's state keys, plus
``rng`` and ``extra``), so checks and reports never depend on a framework's own key names.
"""

MODEL = "model"
OPTIMIZER = "optimizer"
LR_SCHEDULER = "lr_scheduler"
DATALOADER = "dataloader"
RNG = "rng"
TRAIN_STATE = "train_state"
EXTRA = "extra"

CANONICAL_PARTS = (MODEL, OPTIMIZER, LR_SCHEDULER, DATALOADER, RNG, TRAIN_STATE)

WHAT_A_RESUME_LOSES = {
    MODEL: "a resume would start from untrained weights",
    OPTIMIZER: "a resume would restart AdamW moments from zero and spike the loss",
    LR_SCHEDULER: "a resume would restart the learning-rate schedule (warm-up again)",
    DATALOADER: "a resume would restart the data loader at epoch start and repeat or skip data",
    RNG: "a resume would draw different dropout masks and random numbers than the original run",
    TRAIN_STATE: "a resume would not know its step and token count",
}
