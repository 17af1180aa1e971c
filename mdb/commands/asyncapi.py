"""``mdb asyncapi MODULE...``: the contract of an application's listeners as an AsyncAPI 3.0
document (docs/asyncapi.md), for the teams that send to them.

Derived from what the container itself would run (the listeners planned on the settings'
topology), connecting to nothing:

* a **server** per broker the listeners use (its first address, never its credentials);
* a **channel** per logical destination, its address the destination's name, with the brokers
  of its members; its messages are the bodies its listeners decode, their payload schema the
  JSON Schema pydantic makes of the body parameter's annotation (``TypeAdapter.json_schema``;
  models land in ``components.schemas``);
* a ``receive`` **operation** per listener, and a ``send`` operation per error destination (mdb
  itself moves failed messages there, with the failure in headers). An exactly-once listener's
  says so (``x-mdb-exactly-once``), and how it treats a repeated ``mdb_id`` and sends through
  its database's outbox; its error destination also takes the sends its broker refused.

What AsyncAPI has no field for is carried in ``x-mdb-*`` extensions: the destination's kind and
members, a listener's distribution mode, subscription names, pool, transactions, selector and
redelivery policy. STOMP has no AsyncAPI bindings to use instead (its binding object is empty).
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, TypeAdapter

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.container.wiring import find_listeners, import_modules
from mdb.listeners.listener import ListenerSpec
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_LISTENER, ERROR_MESSAGE, ERROR_TYPE, ID, ORIGINAL_DESTINATION
from mdb.routing.planning import PlannedSubscription, plan_listeners

ASYNCAPI = "3.0.0"
SCHEMAS = "#/components/schemas/"


def _string_headers(descriptions: dict[str, str]) -> dict[str, Any]:
    """The JSON Schema of a message's headers: each of ``descriptions`` a string, so
    described."""
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}
                       for name, description in descriptions.items()},
    }


_ERROR_HEADERS = _string_headers({
    ID: "mdb's message id, as the original's",
    ERROR_TYPE: "the exception's type",
    ERROR_MESSAGE: "the exception's text",
    ERROR_LISTENER: "the listener that failed",
    ORIGINAL_DESTINATION: "where the message was sent first",
})
# What an exactly-once listener's error destination takes besides its failed messages: a send
# of its handler that the broker refused (docs/exactly-once.md), its body whatever the handler
# sent.
_REFUSED_HEADERS = _string_headers({
    ID: "mdb's message id, as the send's",
    ERROR_TYPE: "the broker's refusal, as an error type",
    ERROR_MESSAGE: "what the broker said",
    ORIGINAL_DESTINATION: "where the handler sent it",
})
# An exactly-once listener's messages: the id it knows a repeat by.
_ONCE_HEADERS = _string_headers({
    ID: "the message's id: a copy of a message this listener processed is not run again; "
        "without it, the broker's message id counts, else a digest of the content "
        "(docs/exactly-once.md)",
})


async def command(args: argparse.Namespace, settings: Settings) -> None:
    """``mdb asyncapi``: write the document to ``--output`` (default stdout)."""
    text = json.dumps(document(settings, find_listeners(import_modules(args.modules)),
                               version=args.api_version), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)


def document(settings: Settings, listeners: Iterable[ListenerSpec], version: str = "1.0.0",
             ) -> dict[str, Any]:
    """The AsyncAPI document of ``listeners`` deployed with ``settings`` (ConfigurationError
    where the container would refuse them)."""
    topology = settings.topology()
    schemas: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    used: set[str] = set()

    def channel(destination: Destination) -> str:
        key = _key(str(destination))
        if key not in channels:
            members = topology.members(destination)
            used.update(m.broker for m in members)
            channels[key] = {
                "address": destination.name,
                "title": str(destination),
                "servers": [{"$ref": f"#/servers/{_key(b)}"}
                            for b in dict.fromkeys(m.broker for m in members)],
                "messages": {},
                "x-mdb-kind": destination.kind.value,
                "x-mdb-members": [str(m) for m in members],
            }
        return key

    for spec, planned in plan_listeners(settings, listeners):
        database = spec.options.exactly_once
        payload, content_type = _payload(spec.body_type, schemas)
        message = {"name": _body_name(spec.body_type), "contentType": content_type,
                   "payload": payload}
        source = channel(spec.destination)
        channels[source]["messages"][_key(spec.name)] = (
            message if database is None else {**message, "headers": _ONCE_HEADERS})
        operations[_key(spec.name)] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{source}"},
            "messages": [{"$ref": f"#/channels/{source}/messages/{_key(spec.name)}"}],
            **_summary(spec),
            **({} if database is None else {"description": _exactly_once(database)}),
            **_extensions(spec, planned),
        }
        failed = channel(spec.error_destination)
        moved = {_key(f"{spec.name}.failed"): {
            **message, "name": f"{message['name']} that failed in {spec.name}",
            "headers": _ERROR_HEADERS}}
        if database is not None:
            moved[_key(f"{spec.name}.refused_send")] = {
                "name": f"a send of {spec.name} its broker refused", "payload": {},
                "headers": _REFUSED_HEADERS}
        channels[failed]["messages"].update(moved)
        operations[_key(f"{spec.name}.error_destination")] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{failed}"},
            "messages": [{"$ref": f"#/channels/{failed}/messages/{key}"} for key in moved],
            "summary": f"mdb moves a message {spec.name} failed past its redelivery limit, or "
                       f"that does not decode, here"
                       + ("" if database is None else ", and a send of it the broker refused"),
        }
    return {
        "asyncapi": ASYNCAPI,
        "info": {"title": settings.app, "version": version,
                 "description": f"The listeners of app {settings.app}, by `mdb asyncapi`."},
        "servers": {_key(name): _server(name, settings.brokers[name])
                    for name in settings.brokers if name in used},
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas},
    }


def _payload(annotation: Any, schemas: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The JSON Schema of a body decoded as ``annotation`` (its models moved to ``schemas``),
    and the content type mdb sends such a body with (``codec.encode``)."""
    if annotation is bytes or annotation is Any:
        return {"type": "string", "format": "binary"}, codec.BYTES
    schema = TypeAdapter(annotation).json_schema(ref_template=SCHEMAS + "{model}")
    schemas.update(schema.pop("$defs", {}))
    if annotation is str:
        return schema, codec.TEXT
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        schemas[annotation.__name__] = schema
        return {"$ref": SCHEMAS + annotation.__name__}, codec.JSON
    return schema, codec.JSON


def _body_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)


def _exactly_once(database: str) -> str:
    """What an exactly-once listener promises its senders and the consumers of its sends."""
    return (f"Exactly once, with database `{database}` (docs/exactly-once.md): a message whose "
            f"`{ID}` this listener already processed is settled without running again, so a "
            f"sender may repeat a message with its `{ID}` (with the same body and headers, or "
            f"proven with the application's secret: docs/exactly-once.md, \"Identity\"). What "
            f"the handler sends is written "
            f"to the database's outbox in the transaction that records the message, and sent "
            f"after its commit; a send made twice (a process ending between the broker's "
            f"receipt and the outbox's delete) carries the same `{ID}` both times.")


def _summary(spec: ListenerSpec) -> dict[str, str]:
    doc = inspect.getdoc(spec.handler)
    return {"summary": doc.split("\n\n", 1)[0].replace("\n", " ")} if doc else {}


def _extensions(spec: ListenerSpec, planned: tuple[PlannedSubscription, ...]) -> dict[str, Any]:
    options = spec.options
    found: dict[str, Any] = {
        "x-mdb-listener": spec.name,
        "x-mdb-pool": options.pool,
        "x-mdb-transacted": options.transacted,
        "x-mdb-redelivery": options.redelivery.model_dump(),
        "x-mdb-error-destination": str(spec.error_destination),
    }
    if spec.destination.kind.value == "topic":
        found["x-mdb-distribution"] = options.distribution.value
        found["x-mdb-durable"] = options.durable
        found["x-mdb-subscriptions"] = sorted({p.name for p in planned})
    if options.selector is not None:
        found["x-mdb-selector"] = options.selector
    if options.exactly_once is not None:
        found["x-mdb-exactly-once"] = options.exactly_once
    return found


def _server(name: str, broker: BrokerSettings) -> dict[str, Any]:
    address = urlsplit(broker.addresses[0])
    scheme, _, dialect = address.scheme.partition("+")
    server: dict[str, Any] = {
        "host": address.netloc.rpartition("@")[2] or "embedded",
        "protocol": scheme,
        "title": name,
    }
    if address.path not in ("", "/"):
        server["pathname"] = address.path
    if dialect:
        server["x-mdb-broker"] = dialect
    if len(broker.addresses) > 1:
        server["x-mdb-standby-hosts"] = [urlsplit(a).netloc.rpartition("@")[2]
                                         for a in broker.addresses[1:]]
    return server


def _key(text: str) -> str:
    """A component key AsyncAPI accepts (letters, digits, ``.``, ``-``, ``_``)."""
    return re.sub(r"[^\w.\-]", "_", text)
