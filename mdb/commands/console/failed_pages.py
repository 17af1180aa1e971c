"""The console's failed messages (docs/console.md, "Failed messages"): every error destination
with its counts per failure type, a page of one, one message whole, and replay and purge of a
selection, through ``FailedMessages``, the implementation ``mdb dlq`` runs (the same selection,
the same locks, the same rules of where a replay may send back: docs/failed-messages.md).

The ``*_body`` functions make the HTML of what the service found, every value through
``escape`` (and, being a producer's text, through ``printable`` first: no control, format or
bidirectional character reaches the page either); ``FailedPages`` is what the console's router
calls. A form is shown only to a session that may act: it carries the router's CSRF field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from urllib.parse import urlencode

from mdb.commands.console.html import escape, quoted
from mdb.commands.console.pages import Fragment
from mdb.commands.dlq.failed import Done, ErrorDestination
from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.failed_messages import COUNT_LIMIT, Counts, FailedMessages, Page
from mdb.commands.dlq.replays import Left
from mdb.commands.dlq.selection import Selection
from mdb.config.settings import Settings
from mdb.errors import BrokerError, ConfigurationError, QueueLocked
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_MESSAGE, ERROR_TRACEBACK
from mdb.observability.redaction import printable

PAGE_SIZE = 50
"""Messages a page of an error destination lists."""

_COLUMNS = (("ID", "id"), ("From", "original_destination"), ("Type", "error_type"),
            ("Count", "delivery_count"), ("Failed at (UTC)", "failed_at"),
            ("Bytes", "body_bytes"), ("Error", "error"))
_FIELDS = ("id", "broker", "original_destination", "listener", "error_type", "delivery_count",
           "failed_at", "body_bytes")


def text(value: object) -> str:
    """A value a producer may have written, as the page shows it: printable, escaped."""
    return escape(printable("-" if value is None else str(value)))


def _href(destination: Destination, *rest: str, query: str = "") -> str:
    path = "/".join(quoted(part) for part in (str(destination), *rest))
    return escape(f"/failed/{path}" + (f"?{query}" if query else ""))


def _types(counts: Counts) -> str:
    """The counts per failure type, each a link to its page (but for the messages that name
    none: a producer's own, an end marker left on RabbitMQ)."""
    items = "".join(
        f'<li><a href="{_href(counts.destination, query=_query(error_type, 0))}">'
        f"{text(error_type)}</a>: {count}</li>" if error_type else f"<li>(none): {count}</li>"
        for error_type, count in counts.types)
    return f'<ul class="types">{items}</ul>' if items else ""


def _total(counts: Counts) -> str:
    return f"{counts.total}" if counts.complete else f"{counts.total}+ (the first counted)"


def _query(error_type: str | None, offset: int) -> str:
    pairs = [("error_type", error_type)] if error_type is not None else []
    return urlencode([*pairs, *([("offset", str(offset))] if offset else [])])


def index_body(found: Sequence[Counts | tuple[Destination, str]]) -> str:
    """The error destinations, each with its counts per failure type, or why it could not be
    read (its broker's words); none: which setting names them."""
    if not found:
        return ("<p>No error destination is named: set <code>console.error_destinations</code> "
                "(<code>[\"queue:orders.DLQ\"]</code>) or <code>console.modules</code> (the "
                "application's modules: their listeners' error destinations).</p>")
    rows = []
    for item in found:
        if isinstance(item, Counts):
            rows.append(f'<tr><td><a href="{_href(item.destination)}">'
                        f"{escape(item.destination)}</a></td><td>{_total(item)}</td>"
                        f"<td>{_types(item)}</td></tr>")
        else:
            destination, error = item
            rows.append(f"<tr><td>{escape(destination)}</td>"
                        f'<td colspan="2" class="error">{text(error)}</td></tr>')
    return ("<table><tr><th>Error destination</th><th>Messages</th><th>Per failure type</th>"
            f"</tr>{''.join(rows)}</table>")


def destination_body(page: Page, counts: Counts, csrf: str) -> str:
    """A page of an error destination: its counts per failure type (each a filter), the
    messages of the page in its order, each a link to it and, for a session that may act
    (``csrf``, the router's hidden field), a checkbox of the selection to replay or purge;
    links to the pages before and after."""
    destination = page.destination
    shown = "all types" if page.error_type is None else f"type {text(page.error_type)}"
    parts = [f"<p>{_total(counts)} message(s); showing {shown}, from message "
             f"{page.offset + 1 if page.rows else page.offset}. "
             f'<a href="{_href(destination)}">All types</a></p>', _types(counts)]
    heads = "".join(f"<th>{escape(head)}</th>" for head, _ in _COLUMNS)
    rows = []
    for failed in page.rows:
        row = failed.summary()
        shown_id = printable(failed.id)
        pick = (f'<td><input type="checkbox" name="ids" value="{escape(shown_id)}" '
                f'aria-label="select {escape(shown_id)}"></td>' if csrf else "")
        cells = "".join(
            f'<td><a href="{_href(destination, shown_id)}">{text(row[name])}</a></td>'
            if name == "id" else f"<td>{text(row[name])}</td>" for _, name in _COLUMNS)
        rows.append(f"<tr>{pick}{cells}</tr>")
    table = (f"<table><tr>{'<th>Select</th>' if csrf else ''}{heads}</tr>{''.join(rows)}"
             "</table>") if rows else "<p>None.</p>"
    parts.append(_actions(destination, csrf, table, "selected") if csrf and rows else table)
    if not csrf and rows:
        parts.append('<p class="note">Log in to replay or purge.</p>')
    pager = []
    if page.offset:
        before = max(0, page.offset - PAGE_SIZE)
        pager.append(f'<a href="{_href(destination, query=_query(page.error_type, before))}">'
                     "Previous</a>")
    if page.more and page.offset + PAGE_SIZE <= COUNT_LIMIT:
        after = page.offset + len(page.rows)
        pager.append(f'<a href="{_href(destination, query=_query(page.error_type, after))}">'
                     "Next</a>")
    if pager:
        parts.append(f'<p class="pager">{" ".join(pager)}</p>')
    return "\n".join(part for part in parts if part)


def _actions(destination: Destination, csrf: str, inside: str, what: str) -> str:
    """A form around ``inside`` posting its ``ids`` to replay, or (the second button) to
    purge."""
    return (f'<form method="post" action="{_href(destination, "replay")}">{csrf}{inside}'
            f'<p><button type="submit">Replay {what}</button> '
            f'<button type="submit" formaction="{_href(destination, "purge")}">'
            f"Purge {what} (cannot be undone)</button></p></form>")


def message_body(failed: Failed, destination: Destination, csrf: str) -> str:
    """One message whole: what ``mdb dlq show`` prints (its failure, traceback, headers with
    secrets masked, body as text bounded at ``failed.BODY_LIMIT`` bytes), and, for a session
    that may act, its replay and purge."""
    summary = failed.summary()
    fields = "".join(f"<tr><th>{escape(name)}</th><td>{text(summary[name])}</td></tr>"
                     for name in _FIELDS)
    parts = [f"<table>{fields}</table>"]
    for section, header in (("Error", ERROR_MESSAGE), ("Traceback", ERROR_TRACEBACK)):
        if lines := failed.shown_lines(header):
            parts.append(f"<h2>{section}</h2><pre>{escape(chr(10).join(lines))}</pre>")
    headers = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>"
                      for name, value in sorted(failed.shown_headers().items())
                      if name not in (ERROR_MESSAGE, ERROR_TRACEBACK))
    parts.append(f"<h2>Headers</h2><table>{headers}</table>")
    parts.append(f"<h2>Body</h2><pre>{escape(failed.shown_body())}</pre>")
    if csrf:
        hidden = f'<input type="hidden" name="ids" value="{escape(printable(failed.id))}">'
        parts.append(_actions(destination, csrf, hidden, "this message"))
    parts.append(f'<p><a href="{_href(destination)}">Back to {escape(destination)}</a></p>')
    return "\n".join(parts)


def done_body(destination: Destination, verb: str, done: Done, left: Sequence[Left]) -> str:
    """What a replay or purge did, as ``mdb dlq`` says it: how many it took, the others it
    moved to the back on the way, and each selected one it left, and why."""
    parts = [f"<p>{escape(verb)} {done.taken} message(s).</p>"]
    if done.moved_back:
        parts.append(f"<p>{done.moved_back} not selected went to the back of the error "
                     "destination, unchanged.</p>")
    if left:
        items = "".join(f"<li>{text(one.id)}: {text(one.reason)}</li>" for one in left)
        parts.append(f'<div class="error"><p>{len(left)} left on the error destination '
                     f"(replay with <code>mdb dlq replay --to DESTINATION --id ID</code>, or "
                     f"purge):</p><ul>{items}</ul></div>")
    parts.append(f'<p><a href="{_href(destination)}">Back to {escape(destination)}</a></p>')
    return "\n".join(parts)


def _locked(exc: QueueLocked) -> Fragment:
    return Fragment("Busy", f'<p class="error">{text(exc)}</p>', HTTPStatus.CONFLICT)


class FailedPages:
    """The failed messages' pages and actions the console's router calls, on the error
    destinations of ``failed``."""

    def __init__(self, failed: FailedMessages) -> None:
        self._failed = failed

    @classmethod
    def of(cls, settings: Settings, error_destinations: Sequence[str] = (),
           modules: Sequence[str] = ()) -> FailedPages:
        """The error destinations ``console.error_destinations`` names, else those of the
        listeners of ``console.modules``, on the brokers of ``settings``; ConfigurationError
        naming the setting for one that cannot be."""
        setting = "console.error_destinations" if error_destinations else "console.modules"
        try:
            return cls(FailedMessages.of(settings, error_destinations, modules,
                                         command=f"{setting}:"))
        except ConfigurationError as exc:
            said = str(exc)
            raise ConfigurationError(said if said.startswith(setting) else f"{setting}: {said}") \
                from None

    def _find(self, name: str) -> ErrorDestination | Fragment:
        found = self._failed.find(name)
        if found is None:
            return Fragment("Not found", f"<p>{text(name)} is not an error destination of "
                            "this console (<code>console.error_destinations</code>).</p>",
                            HTTPStatus.NOT_FOUND)
        return found

    async def index(self, csrf: str) -> Fragment:
        """GET /failed."""
        found: list[Counts | tuple[Destination, str]] = []
        for errors in self._failed.destinations:
            try:
                found.append(await self._failed.counts(errors.destination))
            except BrokerError as exc:  # one destination out of reach hides no other
                found.append((errors.destination, str(exc)))
        return Fragment("Failed messages", index_body(found))

    async def destination(self, destination: str, query: Mapping[str, Sequence[str]],
                          csrf: str) -> Fragment:
        """GET /failed/<destination>?error_type=TYPE&offset=N."""
        errors = self._find(destination)
        if isinstance(errors, Fragment):
            return errors
        offset_text = (query.get("offset") or ["0"])[0]
        offset = int(offset_text) if offset_text.isascii() and offset_text.isdigit() else 0
        types = query.get("error_type")
        error_type = types[0] if types else None
        try:
            counts = await self._failed.counts(errors.destination)
            page = await self._failed.page(errors.destination, min(offset, COUNT_LIMIT),
                                           PAGE_SIZE, error_type)
        except QueueLocked as exc:
            return _locked(exc)
        return Fragment(f"Failed messages: {errors.destination}",
                        destination_body(page, counts, csrf))

    async def message(self, destination: str, message_id: str, csrf: str) -> Fragment:
        """GET /failed/<destination>/<message id>."""
        errors = self._find(destination)
        if isinstance(errors, Fragment):
            return errors
        try:
            failed = await self._failed.show(message_id, errors.destination)
        except QueueLocked as exc:
            return _locked(exc)
        except ConfigurationError:
            return Fragment("Not found", f"<p>No message {text(message_id)} on "
                            f"{escape(errors.destination)}.</p>", HTTPStatus.NOT_FOUND)
        return Fragment(f"Message {printable(failed.id)}",
                        message_body(failed, errors.destination, csrf))

    async def replay(self, destination: str, ids: Sequence[str]) -> Fragment:
        """POST /failed/<destination>/replay, ``ids`` the selection: as ``mdb dlq replay
        --id ID...``."""
        return await self._act(destination, ids, "Replayed")

    async def purge(self, destination: str, ids: Sequence[str]) -> Fragment:
        """POST /failed/<destination>/purge, ``ids`` the selection: as ``mdb dlq purge --id
        ID... --yes`` (the button is the confirmation)."""
        return await self._act(destination, ids, "Purged")

    async def _act(self, destination: str, ids: Sequence[str], verb: str) -> Fragment:
        errors = self._find(destination)
        if isinstance(errors, Fragment):
            return errors
        if not ids:
            return Fragment("Nothing selected", "<p>Select the messages first.</p>"
                            f'<p><a href="{_href(errors.destination)}">Back</a></p>',
                            HTTPStatus.BAD_REQUEST)
        selection, left = Selection(ids=frozenset(ids)), list[Left]()
        try:
            if verb == "Replayed":
                done = await self._failed.replay(selection, destination=errors.destination,
                                                 left=left.append)
            else:
                done = await self._failed.purge(selection, destination=errors.destination)
        except QueueLocked as exc:
            return _locked(exc)
        return Fragment(f"{verb}: {errors.destination}",
                        done_body(errors.destination, verb, done, left))

    async def close(self) -> None:
        """Nothing to close: each operation opens and closes its own broker connection."""
