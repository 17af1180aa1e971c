"""What the fault tools' command lines share: a parser whose usage names the tool as it is run
and whose description is the first paragraph of the tool's docstring, and the exit of a run
that cannot start because a server it needs is not installed."""

from __future__ import annotations

import argparse
import sys


def parser_for(tool: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m tests.faults.tools.<tool>``, described by ``doc``."""
    return argparse.ArgumentParser(prog=f"python -m tests.faults.tools.{tool}",
                                   description=doc.split("\n\n")[0] if doc else None)


def not_installed(what: str) -> int:
    """Say on stderr that ``what`` is not installed here; the exit status to end with."""
    print(f"{what} is not installed here", file=sys.stderr)
    return 2
