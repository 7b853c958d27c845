"""drill inside the trainers big runs use: seal each checkpoint as (or right after) it is saved.

- :mod:`drill.integrations.hf` — transformers' ``Trainer``: :class:`~drill.integrations.hf.DrillSealCallback`.
- DCP loops, torchtitan, Lightning's FSDP strategy: save through :func:`drill.sdk.save` /
  :func:`drill.sdk.async_save` or pass :class:`drill.sdk.SealingWriter` as the ``storage_writer``
  (see the README's "Sealed at save").
"""
