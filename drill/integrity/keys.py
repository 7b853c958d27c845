"""The key for keyed seals: from a file, or from the environment — never from a command line
(where ``ps`` shows it), and never printed, logged or recorded.

An unkeyed seal proves the bytes are what was sealed, but whoever can write the checkpoint
can also rewrite its manifest and every digest in it. A keyed seal adds an HMAC-SHA256 that
only a holder of the key can produce: keep the key where the training job can read it and the
checkpoint's other writers cannot.
"""

from __future__ import annotations

import os

from drill.storage.local import read_regular

KEY_FILE_ENV = "DRILL_SEAL_KEY_FILE"
KEY_ENV = "DRILL_SEAL_KEY"
MIN_KEY_BYTES = 16
MAX_KEY_FILE_BYTES = 1 << 20
"""A key file larger than this is not a key (a log, a device): refused unread."""


class SealKeyError(ValueError):
    """The key cannot be used; the message never contains it."""


def load_key(
    key_file: str | os.PathLike[str] | None = None,
    *,
    file_env: str = KEY_FILE_ENV,
    env: str = KEY_ENV,
    what: str = "seal key",
) -> bytes | None:
    """``key_file``, else ``$DRILL_SEAL_KEY_FILE``, else ``$DRILL_SEAL_KEY``; None when none is set.

    A key file holds the key's bytes (one trailing newline is ignored). ``file_env``, ``env``
    and ``what`` name another key read the same way (the audit chain's).
    """
    path = key_file or os.environ.get(file_env)
    if path:
        try:
            key = read_regular(path, MAX_KEY_FILE_BYTES)
        except (OSError, ValueError) as exc:
            raise SealKeyError(
                f"the {what} file {path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
            ) from None
        key = key[:-1] if key.endswith(b"\n") else key
        source = f"the {what} file {path}"
    elif os.environ.get(env):
        key, source = os.environ[env].encode(), f"${env}"
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise SealKeyError(
            f"{source} holds {len(key)} bytes; a {what} needs at least {MIN_KEY_BYTES} (e.g. head -c 32 /dev/urandom)"
        )
    return key
