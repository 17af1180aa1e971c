"""Printing from handlers: plain ``def`` handlers run in worker threads, and ``print`` writes
the text and the newline separately, so lines of two threads could interleave."""

import sys


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
