"""Input ``mdb migrate weblogic`` cannot migrate: each is one line naming the file, the element
and the fix, exit status 2, and nothing written (docs/migrating-from-weblogic.md, "When the
input cannot be migrated")."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from mdb import ConfigurationError
from mdb.commands.migrate.command import migrate
from tests.harness.apps import weblogic_app
from tests.harness.processes.cli import mdb, one_line


def write(folder: Path, files: dict[str, str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        paths.append(folder / name)
    return paths


def refused(tmp_path: Path, files: dict[str, str], *more: Path) -> str:
    """What migrating ``files`` says, having written nothing."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    with pytest.raises(ConfigurationError) as raised:
        migrate([*write(tmp_path / "in", files), *more], out)
    assert list(out.iterdir()) == []
    message = str(raised.value)
    assert "\n" not in message
    return message


SHOP = {"ejb-jar.xml": weblogic_app.ejb_jar(),
        "weblogic-ejb-jar.xml": weblogic_app.weblogic_ejb_jar(),
        "orders-jms.xml": weblogic_app.jms_module(), "config/config.xml": weblogic_app.domain(),
        "src/InvoiceBean.java": weblogic_app.INVOICE_BEAN}


def with_(name: str, text: str) -> dict[str, str]:
    return {**SHOP, name: text}


# A descriptor mdb migrate cannot read, and what the line says of it.
BAD_INPUT = {
    "malformed XML": (with_("ejb-jar.xml", weblogic_app.ejb_jar()[:-20]),
                      ["ejb-jar.xml: not well-formed XML", "mend the file"]),
    "an entity declaration": (with_("ejb-jar.xml", weblogic_app.ejb_jar().replace(
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<?xml version="1.0"?><!DOCTYPE ejb-jar [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>')),
        ["ejb-jar.xml: has a DOCTYPE", "never expands entities", "weblogic.DDConverter"]),
    "an EJB 2.0 descriptor": (with_("ejb-jar.xml", '<?xml version="1.0"?>\n<!DOCTYPE ejb-jar '
                                    'PUBLIC "-//Sun Microsystems, Inc.//DTD Enterprise '
                                    'JavaBeans 2.0//EN" "http://java.sun.com/dtd/ejb-jar_2_0.dtd'
                                    '">\n<ejb-jar/>'), ["a DTD-based descriptor"]),
    "an unknown namespace": (with_("weblogic-ejb-jar.xml", weblogic_app.weblogic_ejb_jar()
                                   .replace("xmlns.oracle.com/weblogic/weblogic-ejb-jar",
                                            "example.com/weblogic-ejb-jar")),
                             ["weblogic-ejb-jar.xml: <weblogic-ejb-jar> "
                              "'http://example.com/weblogic-ejb-jar': an unknown namespace",
                              "http://xmlns.oracle.com/weblogic/weblogic-ejb-jar"]),
    "a misspelt element": (with_("weblogic-ejb-jar.xml", weblogic_app.weblogic_ejb_jar(
        extra_descriptor="      <max-beans-in-pool>3</max-beans-in-pool>\n")),
        ["<weblogic-enterprise-bean[OrderIntakeBean]/message-driven-descriptor/"
         "max-beans-in-pool>", "not an element of <message-driven-descriptor>",
         "check its spelling"]),
    "a pool of lots": (with_("weblogic-ejb-jar.xml", weblogic_app.weblogic_ejb_jar().replace(
        "<max-beans-in-free-pool>8<", "<max-beans-in-free-pool>lots<")),
        ["pool/max-beans-in-free-pool> 'lots': not a whole number"]),
    "an acknowledge mode of none": (with_("ejb-jar.xml", weblogic_app.ejb_jar().replace(
        ">Auto-acknowledge<", ">Sometimes<")),
        ["activation-config-property[acknowledgeMode]> 'Sometimes': not a value allowed here",
         "write one of Auto-acknowledge, Dups-ok-acknowledge"]),
    "a trans-attribute no bean may have": (with_("ejb-jar.xml", weblogic_app.ejb_jar().replace(
        "<trans-attribute>Required<", "<trans-attribute>RequiresNew<")),
        ["method[OrderAuditBean.*]> 'RequiresNew': not allowed on a message-driven "
         "bean's onMessage", "Required and NotSupported"]),
    "a distribution mode of none": (with_("ejb-jar.xml", weblogic_app.ejb_jar().replace(
        ">One-Copy-Per-Server<", ">One-Copy-Per-Galaxy<")),
        ["'One-Copy-Per-Galaxy': not a value allowed here"]),
    "a destination the module does not define": (with_("weblogic-ejb-jar.xml",
        weblogic_app.weblogic_ejb_jar().replace(">jms/Orders<", ">jms/Ordres<")),
        ["destination-jndi-name> 'jms/Ordres': the JMS modules given define no destination "
         "of this JNDI name", "give the module that defines it"]),
    "an unknown activation property": (with_("ejb-jar.xml", weblogic_app.ejb_jar(
        extra_properties=(("maxPoolSize", "4"),))),
        ["'maxPoolSize' is not an activation property of WebLogic, the Jakarta standard"]),
    "Compatibility on a partitioned topic": (with_("ejb-jar.xml", weblogic_app.ejb_jar().replace(
        ">One-Copy-Per-Server<", ">Compatibility<")),
        ["Compatibility on a partitioned distributed topic: WebLogic refuses it too"]),
    "a forwarding policy of none": (with_("orders-jms.xml", weblogic_app.jms_module(
        forwarding="Sideways")), ["forwarding-policy> 'Sideways': not a value WebLogic allows",
                                  "Partitioned, Replicated"]),
    "an error destination the module lacks": (with_("orders-jms.xml", weblogic_app.jms_module()
        .replace("<error-destination>OrdersError<", "<error-destination>Nowhere<")),
        ["error-destination> 'Nowhere': the module defines no destination of this name"]),
    "a sub-deployment the domain lacks": (with_("orders-jms.xml", weblogic_app.jms_module()
        .replace("<sub-deployment-name>FirstServer<", "<sub-deployment-name>Elsewhere<")),
        ["sub-deployment-name> 'Elsewhere': jms-system-resource ShopModule of the domain has "
         "no sub-deployment of this name"]),
    "a uniform distributed topic without the domain": (
        {name: text for name, text in SHOP.items() if name != "config/config.xml"},
        ["<uniform-distributed-queue[Orders]> 'Orders': its members are the JMS servers its "
         "sub-deployment targets", "give the domain's config/config.xml"]),
    "a described bean defined nowhere": (
        {name: text for name, text in SHOP.items() if not name.endswith(".java")},
        ["<weblogic-enterprise-bean[InvoiceBean]/ejb-name> 'InvoiceBean': describes bean "
         "InvoiceBean, which no ejb-jar.xml <message-driven> nor @MessageDriven source "
         "defines", "a .class file is not read"]),
    "a bean with two destinations in one descriptor": (with_("ejb-jar.xml", weblogic_app.ejb_jar(
        extra_properties=(("destinationLookup", "jms/A"), ("destination", "jms/B")))),
        ["activation-config-property[destination]> 'jms/B': bean OrderIntakeBean already has "
         "'jms/A' for this", "keep one of the two"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_input_that_cannot_be_migrated_is_one_line_naming_the_fix(tmp_path: Path,
                                                                  case: str) -> None:
    files, says = BAD_INPUT[case]
    message = refused(tmp_path, files)
    for part in says:
        assert part in message, message


def test_a_constant_in_an_annotation_is_refused_naming_its_line(tmp_path: Path) -> None:
    source = weblogic_app.INVOICE_BEAN.replace('propertyValue = "javax.jms.Queue"',
                                               "propertyValue = Destinations.QUEUE")
    message = refused(tmp_path, {**SHOP, "src/InvoiceBean.java": source})
    assert "InvoiceBean.java: <line 16: @ActivationConfigProperty(propertyValue)> " \
           "'Destinations.QUEUE': not a literal" in message
    assert "give the setting in ejb-jar.xml, whose value beats the annotation's" in message


def test_an_archive_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shop.ear").write_bytes(b"PK not really")
    message = refused(tmp_path, {}, tmp_path / "shop.ear")
    assert message.endswith("shop.ear: not a zip archive (an .ear, .jar or .war is one): is "
                            "it whole?")


def test_a_descriptor_too_large_to_read_is_refused(tmp_path: Path) -> None:
    ear = tmp_path / "big.ear"
    with zipfile.ZipFile(ear, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("META-INF/ejb-jar.xml", b" " * (17 << 20))
    assert "META-INF/ejb-jar.xml: larger than 16 MiB" in refused(tmp_path, {}, ear)


def test_input_without_a_bean_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, {"orders-jms.xml": weblogic_app.jms_module()})
    assert "no message-driven bean in " in message


def test_the_command_exits_2_in_one_line_and_writes_over_nothing(tmp_path: Path) -> None:
    paths = weblogic_app.write_sources(tmp_path / "app")
    out = tmp_path / "out"
    out.mkdir()
    (out / "listeners.py").write_text("# ported handlers\n")
    done = mdb("migrate", "weblogic", str(paths["ear"]), str(paths["src"]),
               str(paths["domain"]), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"mdb: configuration error: {out} already has listeners.py: mdb migrate writes over "
        "nothing (a ported handler would be lost); move it away, or give another --out")
    assert sorted(p.name for p in out.iterdir()) == ["listeners.py"]
    assert (out / "listeners.py").read_text() == "# ported handlers\n"
    broken = write(tmp_path / "broken", {"ejb-jar.xml": "<ejb-jar"})
    done = mdb("migrate", "weblogic", str(broken[0]), "--out", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(
        f"mdb: configuration error: {broken[0]}: not well-formed XML (")
