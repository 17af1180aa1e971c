"""The files a migration reads, from what the user names: an archive (``.ear``, ``.jar``,
``.war``: a zip, and the modules zipped in an ``.ear``), a folder (an exploded archive, a
source tree, a domain's folder), or single files.

From an archive or a folder only these are taken: ``ejb-jar.xml`` and
``weblogic-ejb-jar.xml`` (in ``META-INF/`` or ``WEB-INF/``), JMS modules (``*-jms.xml``),
a domain's ``config/config.xml`` and Java sources (``*.java``) that declare a
``@MessageDriven`` bean. A file named by itself is taken whatever its name: an XML file is a
descriptor, told by its root element. Nothing is read without bounds: a descriptor or source
larger than 16 MiB, or a nested archive larger than 256 MiB, stops the migration.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mdb import ConfigurationError
from mdb.observability.redaction import printable

MAX_FILE = 16 << 20
MAX_ARCHIVE = 256 << 20
_ARCHIVES = (".ear", ".jar", ".war")
_BEAN_DESCRIPTORS = ("ejb-jar.xml", "weblogic-ejb-jar.xml")


@dataclass(frozen=True)
class Input:
    file: str
    """Where it is, as the user finds it: ``orders.ear!orders-ejb.jar!META-INF/ejb-jar.xml``."""
    data: bytes
    named: bool = False
    """Named by the user: whatever its name, it must be a descriptor or a source."""

    @property
    def java(self) -> bool:
        return self.file.endswith(".java")


def read(paths: Sequence[Path]) -> list[Input]:
    """Every input of ``paths``, in a stable order; ConfigurationError, one line, for a path
    that cannot be read or is none of the above."""
    found: list[Input] = []
    for path in paths:
        shown = printable(str(path))
        if path.is_dir():
            found += _folder(path, shown)
        elif path.suffix.lower() in _ARCHIVES:
            found += _archive(_bytes(path, shown, MAX_ARCHIVE), shown, nested=False)
        elif path.suffix.lower() in (".xml", ".java"):
            found.append(Input(shown, _bytes(path, shown, MAX_FILE), named=True))
        elif path.exists():
            raise ConfigurationError(
                f"{shown}: not an archive (.ear, .jar, .war), a folder, an XML descriptor or "
                "a Java source; name the application's archive or its descriptors")
        else:
            raise ConfigurationError(f"{shown}: no such file or folder")
    return found


def wanted(name: str) -> bool:
    """Whether a file of an archive or a folder, at ``name`` (a relative POSIX path), is one
    a migration reads."""
    path = PurePosixPath(name)
    if path.name in _BEAN_DESCRIPTORS:
        return path.parent.name in ("META-INF", "WEB-INF")
    if path.name == "config.xml":
        return path.parent.name == "config"
    return path.name.endswith("-jms.xml") or path.suffix == ".java"


def _folder(folder: Path, shown: str) -> Iterator[Input]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(root, name)
            relative = path.relative_to(folder).as_posix()
            if wanted(relative):
                where = printable(f"{shown.rstrip('/')}/{relative}")
                data = _bytes(path, where, MAX_FILE)
                if not relative.endswith(".java") or b"@MessageDriven" in data:
                    yield Input(where, data)


def _archive(data: bytes, shown: str, *, nested: bool) -> list[Input]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ConfigurationError(f"{shown}: not a zip archive (an .ear, .jar or .war is "
                                 "one): is it whole?") from None
    found: list[Input] = []
    with archive:
        for entry in sorted(archive.infolist(), key=lambda e: e.filename):
            name = entry.filename
            where = printable(f"{shown}!{name}")
            module = PurePosixPath(name).suffix.lower() in _ARCHIVES
            if entry.is_dir() or not (wanted(name) or (module and not nested
                                                       and "/lib/" not in f"/{name}")):
                continue
            limit = MAX_ARCHIVE if module else MAX_FILE
            if entry.file_size > limit:
                raise ConfigurationError(f"{where}: larger than {limit >> 20} MiB, more than "
                                         "mdb migrate reads")
            try:
                with archive.open(entry) as member:
                    content = member.read(limit + 1)
            except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError) as exc:
                raise ConfigurationError(f"{where}: cannot be read from the archive "
                                         f"({printable(str(exc))})") from None
            if len(content) > limit:
                raise ConfigurationError(f"{where}: larger than {limit >> 20} MiB, more than "
                                         "mdb migrate reads")
            if module:
                found += _archive(content, where, nested=True)
            elif not name.endswith(".java") or b"@MessageDriven" in content:
                found.append(Input(where, content))
    return found


def _bytes(path: Path, shown: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as source:
            data = source.read(limit + 1)
    except OSError as exc:
        raise ConfigurationError(f"{shown}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ConfigurationError(f"{shown}: larger than {limit >> 20} MiB, more than mdb "
                                 "migrate reads")
    return data
