"""What the ``drill`` command begins before it loads its command line.

Loading the command line — typer, and the modules of the command asked for — is a third of a
``drill verify`` of 1.2 GB on two cores, all of it before the first byte is hashed. So the
console script looks at its arguments once before loading it: a full verification spelled
``drill verify DIR [options]`` — the directory first, no ``--sample`` (a sample depends on the
ledger) and no help asked for — begins the directory's head start
(:func:`drill.integrity.ahead.begin`, with every check a head start makes: a local directory of
regular files only, a seal naming nothing outside it, workers for the cores free), and the command line
loads while the seal's files hash. The command takes it (:func:`taken`) for the directory it
verifies; one it does not take (a usage error, a path that turns out to be something else) is
stopped at exit. Any other command line loads exactly as before.

No ``--timeout`` is in force yet this early, so beginning may take :data:`WITHIN` seconds at
most: on a hung mount (storage that never answers the listing or the seal's read) it is
abandoned, and the verification begins it again under its own ``--timeout``.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drill.integrity.ahead import HeadStart

_begun: HeadStart | None = None
WITHIN = 1.0
"""Seconds a head start may take to begin before the command line loads (a 20,000-file seal:
under 0.1 s)."""


def begin(argv: list[str]) -> None:
    """Begin what ``argv`` (the arguments after ``drill``) allows before the command line loads."""
    global _begun
    if not full_verification(argv):
        return
    from drill.errors import DrillError
    from drill.integrity.ahead import begin as begin_head_start
    from drill.interrupts import deadline
    from drill.proc import claim_process

    claim_process()  # the console script: nothing but drill has run in this process
    try:
        with deadline(WITHIN, "beginning the head start"):
            _begun = begin_head_start(argv[1])
    except DrillError:  # past WITHIN: abandoned, its workers (if any had started) stopped
        _begun = None
    if _begun is not None:
        atexit.register(_begun.stop)  # a head start no command took: its workers stopped and reaped


def taken() -> HeadStart | None:
    """The head start :func:`begin` began for this process's command, handed over once."""
    global _begun
    begun, _begun = _begun, None
    return begun


def full_verification(argv: list[str]) -> bool:
    """Whether ``argv`` asks for a full ``drill verify`` of the path it names first. Options
    are not parsed here (the command line does that, once); the spelling is recognized only
    where no option can change what is verified or whether anything is."""
    if len(argv) < 2 or argv[0] != "verify" or argv[1].startswith("-"):
        return False
    return not any(a in ("--", "-h") or a.startswith(("--sample", "--help")) for a in argv[2:])


__all__ = ["begin", "full_verification", "taken"]
