"""Integrity: proving that every byte of a checkpoint is the byte that was written.

- :mod:`~drill.integrity.manifest`: drill's sealed manifest (``drill seal``), written inside
  the checkpoint: per file its size, chunk digests and an xxh3-128 digest, plus a digest over
  the manifest itself.
- :mod:`~drill.integrity.hashing`: hashing a file's bytes in the same pass that restores them.
- :mod:`~drill.integrity.verify`: comparing what was read with the manifest(s).
- :mod:`~drill.integrity.foreign`: frameworks' own manifests (Megatron ``integrity.json``,
  safetensors shard indexes).
- :mod:`~drill.integrity.structure`: structural proofs for unsealed checkpoints.
- :mod:`~drill.integrity.sampling`: which files a sampled drill verifies.

Importable without torch, SQLAlchemy or boto3, so training scripts can seal.
"""
