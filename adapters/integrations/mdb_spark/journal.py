"""The source's own durable journal: one per member, on any fsspec filesystem.

A broker queue cannot replay a range Spark logged before a crash, so the source copies what it
receives here first: receive → append to the journal (fsync) → ack the broker. A Spark offset
is a journal *position* (how many records were ever appended to that member's journal), and
``commit`` trims what Spark no longer needs.

Layout under the member's URL (``file:///…``, ``/local/path``, ``s3://…``, ``hdfs://…``)::

    seg-00000000000000000000-00000000000000000100.jsonl   records [0, 100), immutable
    seg-00000000000000000100-00000000000000000142.jsonl   records [100, 142)
    trimmed.json                                          {"position": p, "seen": [...]}

Each append writes one new immutable segment (a local file is written beside, fsynced and
renamed; on an object store one PUT is atomic), so a reader never sees half a segment and the
journal works where files cannot be appended to. ``trimmed.json`` remembers the position
before the first retained record and the fingerprints (id and body digest) of the last
``SEEN_LIMIT`` trimmed records, so a message the broker redelivers after its ack was lost is
recognised and not journaled twice.

One writer per journal: the driver-side reader of one query (``app`` + ``name``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

SEEN_LIMIT = 100_000
_SEGMENT = re.compile(r"^seg-(\d{20})-(\d{20})\.jsonl$")
_TRIMMED = "trimmed.json"


@dataclass(frozen=True, slots=True)
class Record:
    """One received message as journaled."""

    message_id: str
    body: bytes
    headers: dict[str, str]
    redelivered: bool
    timestamp_ms: int

    def to_json(self) -> str:
        return json.dumps({"i": self.message_id, "b": base64.b64encode(self.body).decode(),
                           "h": self.headers, "r": self.redelivered, "t": self.timestamp_ms},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Record:
        data: dict[str, Any] = json.loads(line)
        return cls(data["i"], base64.b64decode(data["b"]), dict(data["h"]), bool(data["r"]),
                   int(data["t"]))

    @property
    def fingerprint(self) -> str:
        """The id and a digest of the body: equal for a redelivery of this message, different
        for another message that merely reuses its id."""
        return f"{self.message_id}:{hashlib.sha256(self.body).hexdigest()}"


class Journal:
    """One member's journal at ``url`` (created if missing). Not thread-safe: the source calls
    ``append`` from one task per member and ``trim`` from Spark's driver thread, and both only
    touch files the other does not (a trim never deletes a segment past the committed end)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._fs, self._root = fsspec.core.url_to_fs(url)
        self._fs.makedirs(self._root, exist_ok=True)
        self._local = isinstance(self._fs, LocalFileSystem)
        trimmed = self._read_trimmed()
        self.start: int = trimmed["position"]
        self._trimmed: deque[str] = deque(trimmed["seen"], maxlen=SEEN_LIMIT)
        self._seen: set[str] | None = None  # built on first use: a reader never needs it
        self.end: int = max([self.start, *(end for _, end, _ in self._segments())])

    # -- writing (the driver-side receiver) ------------------------------------------------

    def holds(self, record: Record) -> bool:
        """True when a record with the same id and body is journaled (or was trimmed lately).
        Alone this does not prove a repeat: the receiver also asks the broker's redelivered
        flag."""
        return record.fingerprint in self._fingerprints()

    def _fingerprints(self) -> set[str]:
        if self._seen is None:
            self._seen = set(self._trimmed)
            for _, _, path in self._segments():
                self._seen.update(r.fingerprint for r in self._load(path))
        return self._seen

    def append(self, records: list[Record]) -> int:
        """Write ``records`` durably as one segment; return the new end position."""
        if not records:
            return self.end
        start, end = self.end, self.end + len(records)
        data = "".join(r.to_json() + "\n" for r in records).encode()
        self._write_atomically(self._path(f"seg-{start:020d}-{end:020d}.jsonl"), data)
        if self._seen is not None:
            self._seen.update(r.fingerprint for r in records)
        self.end = end
        return end

    def trim(self, position: int) -> None:
        """Forget records before ``position`` (Spark committed them). Segments that straddle
        ``position`` stay until a later trim passes their end."""
        if position <= self.start:
            return
        gone = [path for _, seg_end, path in self._segments() if seg_end <= position]
        for path in gone:
            for record in self._load(path):
                if len(self._trimmed) == SEEN_LIMIT and self._seen is not None:
                    self._seen.discard(self._trimmed[0])
                self._trimmed.append(record.fingerprint)
        state = {"position": position, "seen": list(self._trimmed)}
        self._write_atomically(self._path(_TRIMMED), json.dumps(state).encode())
        for path in gone:
            self._fs.rm_file(path)
        self.start = position

    # -- reading (executors; any process that reaches the URL) -----------------------------

    def read(self, start: int, end: int) -> Iterator[Record]:
        """The records at positions ``[start, end)``; raises if some were trimmed already."""
        if start < self.start:
            raise ValueError(f"journal {self.url}: positions before {self.start} were trimmed "
                             f"(asked for {start}..{end}); was the journal shared by two queries?")
        for seg_start, seg_end, path in self._segments():
            if seg_end <= start or seg_start >= end:
                continue
            for position, record in enumerate(self._load(path), seg_start):
                if start <= position < end:
                    yield record

    # -- files -----------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    def _segments(self) -> list[tuple[int, int, str]]:
        found = []
        self._fs.invalidate_cache(self._root)  # s3fs and others cache listings per process
        try:
            paths = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:  # an object store has no empty folders: nothing written yet
            paths = []
        for path in paths:
            match = _SEGMENT.match(str(path).rstrip("/").rsplit("/", 1)[-1])
            if match:
                found.append((int(match[1]), int(match[2]), str(path)))
        return sorted(found)

    def _load(self, path: str) -> Iterable[Record]:
        with self._fs.open(path, "rb") as handle:
            text = handle.read().decode()
        return [Record.from_json(line) for line in text.splitlines() if line]

    def _read_trimmed(self) -> dict[str, Any]:
        path = self._path(_TRIMMED)
        if not self._fs.exists(path):
            return {"position": 0, "seen": []}
        with self._fs.open(path, "rb") as handle:
            state: dict[str, Any] = json.loads(handle.read())
        return state

    def _write_atomically(self, path: str, data: bytes) -> None:
        if not self._local:
            self._fs.pipe_file(path, data)  # one PUT: all or nothing on object stores
            return
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
