"""The ``drill`` command: parse, call one library function, render, return an exit code."""


def main() -> None:
    """The ``drill`` console script. A command allocates tens of thousands of long-lived
    objects while it imports typer, rich and drill's modules; at the default threshold the
    cyclic collector walks them again and again, which costs a short command (``drill verify``)
    7% of its run. A command line, not a library's host, so it may tune its own collector: what
    it loads and begins before the command runs is made with the collector paused and then
    frozen (:func:`drill.memory.kept`), never walked again.

    Before the command line loads, what the command can begin without it is begun
    (:mod:`drill.cli.early`: a full ``drill verify``'s hashing)."""
    import gc
    import sys

    from drill.proc import claim_process, standard_streams, working_directory

    claim_process()  # nothing but drill runs in this process: it may fork, and freeze what it keeps
    standard_streams()  # a closed stdout or stderr: /dev/null in its place, never a traceback
    if working_directory() is None:  # removed: relative paths, and torch's own start-up, would fail
        from drill.errors import ExitCode

        sys.stderr.write("drill: error: the working directory no longer exists\nhint: cd to a directory that exists\n")
        sys.exit(int(ExitCode.USAGE))
    gc.set_threshold(20_000, 20, 20)
    from drill.memory import kept

    with kept():  # modules, and a head start's seal: alive until the command ends
        from drill.cli.early import begin

        begin(sys.argv[1:])
        from drill.cli.app import main as run

    run()
