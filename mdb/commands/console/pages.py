"""The layout around every page of the console, and what a route hands it (``Fragment``).

The pages are made on the server and read without JavaScript; the overview asks the browser to
load it again every ``refresh`` seconds (a ``<meta http-equiv="refresh">`` naming ``/``, no
script). The ``Content-Security-Policy`` the router sends (``POLICY``) allows no script at all
and styles only from ``/console.css`` (``STYLE``): a value that escaped the escaping still could
not run."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from mdb.commands.console.html import escape


@dataclass(frozen=True)
class Fragment:
    """A page's title (plain text) and body (escaped HTML), and the status to answer with."""

    title: str
    body: str
    status: int = HTTPStatus.OK


POLICY = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
          "frame-ancestors 'none'; base-uri 'none'")
"""No script, no inline style, no frame: the page's ``Content-Security-Policy``."""

NAVIGATION = (("/", "Fleet"), ("/#listeners", "Listeners"),
              ("/#subscriptions", "Subscriptions"), ("/#databases", "Databases"),
              ("/failed", "Failed messages"))


def layout(title: str, body: str, *, refresh: float | None = None, session: str = "") -> str:
    """The whole document: ``title`` (text, escaped here) over ``body`` (HTML); ``session``
    is the login or logout form the router puts in the header."""
    # The overview's URL named, without a fragment: after an action's redirect to
    # /#listeners, a bare refresh is taken by Chromium for a move within the page, and the page
    # never loads again, showing the fleet as it was right after the action.
    meta = (f'<meta http-equiv="refresh" content="{refresh:g}; url=/">' if refresh is not None
            else "")
    links = " ".join(f'<a href="{href}">{escape(name)}</a>' for href, name in NAVIGATION)
    return ("<!doctype html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"{meta}<title>{escape(title)} · mdb console</title>"
            '<link rel="stylesheet" href="/console.css"></head>\n'
            f'<body><header><strong>mdb console</strong> <nav>{links}</nav>'
            f'<div class="session">{session}</div></header>\n'
            f"<main><h1>{escape(title)}</h1>\n{body}\n</main></body></html>\n")


STYLE = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1b1f24; background: #f6f7f9; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1.2em;
         background: #1f2d3d; color: #fff; }
header a { color: #cfe3ff; margin-right: 1em; }
header .session { margin-left: auto; }
header form { display: inline; }
main { padding: 0 1.2em 2em; }
h2 { margin-top: 1.6em; }
table { border-collapse: collapse; background: #fff; margin: .5em 0; }
th, td { border: 1px solid #d5d9de; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #eef1f4; }
.up, .ready { color: #116b2b; font-weight: 600; }
.down, .failed, .unready { color: #a3161b; font-weight: 600; }
.reconnecting, .paused { color: #a15c00; font-weight: 600; }
.why { color: #555; font-size: 92%; }
.members { margin: 0; padding-left: 1.1em; }
.error { background: #fde8e8; border: 1px solid #a3161b; padding: .6em; }
.note { color: #555; }
pre { white-space: pre-wrap; word-break: break-all; background: #fff; border: 1px solid #d5d9de;
      padding: .5em; max-height: 30em; overflow: auto; }
svg.chart { background: #fff; border: 1px solid #d5d9de; }
button { cursor: pointer; }
"""
"""The console's one style sheet, served as ``/console.css``."""
