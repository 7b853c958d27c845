"""The ``drill`` command: parse, call one library function, render, return an exit code."""
