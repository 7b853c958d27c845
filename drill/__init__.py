"""drill: restore drills and integrity audits for PyTorch training checkpoints.

The library is the product; ``drill.cli`` is a thin skin over it. Importing this package is
cheap on purpose (no torch, SQLAlchemy or boto3): heavy modules are imported where used.
"""

__version__ = "0.1.0"
