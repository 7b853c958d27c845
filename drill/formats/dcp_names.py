"""How DCP names what it writes: facts the DCP format's light and heavy modules both use."""

from __future__ import annotations

import re

DCP_METADATA = ".metadata"
"""DCP's index, which ``dcp.save`` writes last: a directory without it never finished saving."""
SHARD_SUFFIX = ".distcp"
SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp\Z")
"""``FileSystemWriter``'s data files: ``__<rank>_<n>.distcp``."""
MEGATRON_COMMON, MEGATRON_CONFIG = "common.pt", "metadata.json"
"""Megatron-core's dist_checkpointing writes ``common.pt``, then the shards and ``.metadata``,
then ``metadata.json`` last: a directory with the first but not the last never finished."""
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"

__all__ = ["DCP_METADATA", "MEGATRON_COMMON", "MEGATRON_CONFIG", "MEGATRON_TRACKER", "SHARD", "SHARD_SUFFIX"]
