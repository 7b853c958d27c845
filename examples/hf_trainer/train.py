"""A Hugging Face ``Trainer`` fine-tune, as HF's examples write one, that drill can drill: a tiny
GPT-2 built from a config (no download), trained 8 steps, a checkpoint every 4, every step
logged (``logging_steps=1``: the replay compares each one), each checkpoint sealed as it is saved.

    python examples/hf_trainer/train.py ./hf-run
    drill run --root ./hf-run --replay examples/hf_trainer/replay.py:build_replay
"""

from __future__ import annotations

import argparse
import os

from data import train_dataset  # a sibling file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-steps", type=int, default=4)
    out = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from drill.integrations.hf import DrillSealCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=out.output_dir, max_steps=out.steps, save_steps=out.save_steps, per_device_train_batch_size=4,
        logging_steps=1, seed=7, report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=train_dataset(), callbacks=[DrillSealCallback()]).train()


if __name__ == "__main__":
    main()
