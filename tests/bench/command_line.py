"""The command line of a benchmark whose options are all counts (messages, runs, ...)."""

from __future__ import annotations

import argparse


def counts(doc: str | None, **defaults: int) -> argparse.Namespace:
    """Parse ``--name N`` for each of ``defaults`` (``rss_messages`` is ``--rss-messages``),
    each with its default; the usage describes the benchmark by ``doc``'s first line."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser.parse_args()
