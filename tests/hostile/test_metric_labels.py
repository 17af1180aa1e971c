"""Labels a message chooses (docs/security.md, "Hostile input: the operator's files and the
health endpoint's clients"): the reply-to of each request is the requester's, often a
temporary queue of its own, so a handler that replies to many requesters must not make a
series, or keep a count, per reply-to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from mdb.messages.message import OutgoingMessage, ReplyAddress
from mdb.observability import telemetry
from mdb.observability.telemetry import instruments, sends
from tests.harness.servers.process import free_port

WAIT = 60.0  # seconds before a wait fails: a guard against hanging, not a timing
REQUESTS = 300

# Each request asks for its reply on a queue of its own, as requesters with temporary queues
# do; the listener replies to each.
APP = f'''
from dependency_injector import containers, providers

from mdb import Context, listener
from mdb.routing.producer import Producer
from mdb.config.settings import load_settings


async def requests():
    async with Producer(load_settings()) as producer:
        for n in range({REQUESTS}):
            await producer.send("queue:asked", str(n), reply_to=f"queue:answers_{{n}}")
    yield None


class Services(containers.DeclarativeContainer):
    requests = providers.Resource(requests)


@listener("queue:asked")
async def on_asked(body: str, ctx: Context) -> None:
    await ctx.reply(body)
'''


def sent_samples(url: str) -> list[Sample]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        page = answer.read().decode()
    return [sample for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == "messaging_client_sent_messages_total"]


def test_replies_to_many_requesters_are_one_series(tmp_path: Path) -> None:
    (tmp_path / "replying_app.py").write_text(APP)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "replying_app"], cwd=tmp_path,
        env={**os.environ, "MDB_HEALTH_PORT": str(port), "MDB_LOG_LEVEL": "WARNING",
             "OTEL_METRICS_EXPORTER": "prometheus"},
        stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            try:
                samples = sent_samples(url)
            except OSError:  # not listening yet
                samples = []
            replies = [s for s in samples if "messaging_destination_name" not in s.labels
                       or s.labels["messaging_destination_name"].startswith("queue:answers")]
            if sum(s.value for s in replies) == REQUESTS:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.1)  # a poll interval of a condition with a deadline
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT) == 0
    [reply] = replies
    assert reply.labels["messaging_destination_template"] == "(reply-to)"
    assert "messaging_destination_name" not in reply.labels  # nor an empty one
    [request] = [s for s in samples if s.labels.get("messaging_destination_name") == "queue:asked"]
    assert request.value == REQUESTS and "messaging_destination_template" not in request.labels


def test_replies_to_many_requesters_keep_no_count_each() -> None:
    """Without any exporter too: what mdb keeps for its counters does not grow with the
    reply-tos it sent to (the spans of those sends are an exporter's to keep)."""

    def reply(count: int, prefix: str) -> None:
        for n in range(count):
            with telemetry.sending("memory", ReplyAddress(f"/temp-queue/{prefix}{n}"),
                                   OutgoingMessage(b"", {})):
                pass

    def kept() -> tuple[int, int]:
        return len(sends._sent_to), len(instruments.sent._counts)

    reply(10, "warm")
    before = kept()
    reply(5_000, "many")
    assert kept() == before
