"""``mdb migrate weblogic`` on the shop of ``tests.harness.apps.weblogic_app``: the settings and
listeners it writes are the deployment WebLogic had (docs/migrating-from-weblogic.md, "The
worked example"), whatever the version of the descriptors, and every element read is in the
report with what it became or why it has no equivalent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from mdb import Destination, load_settings
from mdb.commands.migrate.command import migrate
from mdb.listeners.listener import spec_of
from tests.harness.apps import weblogic_app
from tests.harness.apps.weblogic_app import (
    BROKERS,
    EJB_NAMESPACES,
    WEBLOGIC_NAMESPACES,
    activation,
    write_sources,
)

ROOT = Path(__file__).resolve().parents[2]


def migrated(tmp_path: Path, **versions: str) -> Path:
    """The shop written and migrated; the folder of what was written."""
    paths = write_sources(tmp_path / "app", **versions)
    out = tmp_path / "out"
    out.mkdir()
    migrate([paths["ear"], paths["src"], paths["domain"]], out)
    return out


def module(out: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"migrated_{id(out)}", out / "listeners.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_the_brokers_and_destinations_are_the_jms_servers_and_the_modules(
        tmp_path: Path) -> None:
    settings = load_settings(migrated(tmp_path) / "mdb.toml")
    assert settings.app == "shop"
    assert list(settings.brokers) == list(BROKERS)
    assert settings.brokers["jms_server_2"].url == "stomp+activemq://shop-2.example.com:61613"
    topology = settings.topology()
    for partitioned in ("topic:OrderEvents", "queue:Orders", "queue:OrdersError"):
        members = topology.members(Destination.parse(partitioned))
        assert [m.broker for m in members] == list(BROKERS), partitioned
    for single in ("queue:InvoiceRequests", "queue:Invoices"):
        assert [m.broker for m in topology.members(Destination.parse(single))] == [
            "jms_server_1"]
    # OrderIntakeBean's suspend seconds and its factory's blocking time, on its queue's brokers
    for name in BROKERS:
        broker = settings.brokers[name]
        assert (broker.reconnect_delay, broker.reconnect_max_delay,
                broker.send_wait_for_reconnect) == (2.0, 20.0, 30.0)


def test_each_bean_is_a_listener_with_the_options_weblogic_gave_it(tmp_path: Path) -> None:
    settings = load_settings(migrated(tmp_path) / "mdb.toml")
    options = {name: o.model_dump(exclude_unset=True)
               for name, o in settings.listeners.items()}
    template = {"limit": 3, "delay": 2.0, "backoff": 1.0, "max_delay": 2.0}
    assert options == {
        "invoice_bean": {"transacted": True, "prefetch": 4,
                         "max_messages_per_transaction": 4},
        "order_audit_bean": {"transacted": True, "distribution": "one-copy-per-app",
                             "subscription": "audit", "prefetch": 4,
                             "redelivery": template},
        "order_intake_bean": {"transacted": True, "pool": 8, "prefetch": 4,
                              "handler_timeout": 45.0, "error_destination": "queue:OrdersError",
                              "redelivery": template},
        "price_cache_bean": {"distribution": "one-copy-per-server",
                             "subscription": "prices_PriceCacheBean-{server}", "pool": 2,
                             "redelivery": template},
    }


def test_the_module_has_a_stub_on_each_beans_destination_that_raises_until_ported(
        tmp_path: Path) -> None:
    out = migrated(tmp_path)
    stubs = module(out)
    specs = {spec.name: str(spec.destination) for spec in map(spec_of, vars(stubs).values())
             if spec is not None}
    assert specs == {"invoice_bean": "queue:InvoiceRequests", "order_audit_bean":
                     "topic:OrderEvents", "order_intake_bean": "queue:Orders",
                     "price_cache_bean": "topic:OrderEvents"}
    source = (out / "listeners.py").read_text()
    assert "# message-driven bean InvoiceBean (com.shop.billing.InvoiceBean)" in source
    with pytest.raises(NotImplementedError, match=r"com\.shop\.audit\.OrderAuditBean"):
        anyio.run(stubs.order_audit_bean, "an order", None)


def test_the_plan_is_the_subscriptions_weblogic_made(tmp_path: Path) -> None:
    out = migrated(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "subscriptions", "listeners", "--config",
         "mdb.toml", "--server", "shop_1"], cwd=out, capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[:6] for line in shown.stdout.splitlines()[1:]]
    audit = [r for r in rows if r[0] == "order_audit_bean"]
    prices = [r for r in rows if r[0] == "price_cache_bean"]
    # One-Copy-Per-Application: one shared durable subscription, the same on every member.
    assert [r[3:] for r in audit] == [["audit", "shared,", "durable"]] * 3
    # One-Copy-Per-Server: this server's own, named after its client id, bean and server.
    assert [r[3:] for r in prices] == [["prices_PriceCacheBean-shop_1", "own,", "durable"]] * 3
    assert [r[0] for r in rows].count("order_intake_bean") == 3  # a member on each broker


@pytest.mark.parametrize("ejb", sorted(EJB_NAMESPACES))
@pytest.mark.parametrize("weblogic", sorted(WEBLOGIC_NAMESPACES))
def test_every_version_of_the_descriptors_migrates_alike(tmp_path: Path, ejb: str,
                                                         weblogic: str) -> None:
    expected = (migrated(tmp_path / "base") / "mdb.toml").read_text()
    found = (migrated(tmp_path / "other", ejb=ejb, weblogic=weblogic) / "mdb.toml").read_text()
    assert found == expected.replace("base/app", "other/app")


def test_the_report_says_what_became_of_every_element_read(tmp_path: Path) -> None:
    report = (migrated(tmp_path) / "migration-report.md").read_text()
    assert "| weblogic-enterprise-bean[OrderIntakeBean]/message-driven-descriptor/pool/" \
           "max-beans-in-free-pool | 8 | listeners.order_intake_bean.pool = 8 |" in report
    assert "| weblogic-enterprise-bean[CatalogBean]/stateless-session-descriptor | CatalogBean | " \
           "— | the descriptor of a " \
           "session or entity bean, not a message listener: not migrated |" in report
    assert "line 23: @TransactionAttribute of InvoiceBean | Required | " \
           "listeners.invoice_bean.transacted = true |" in report
    assert "| queue[InvoiceRequests]/thresholds | (bytes-high) | — | a setting of the " \
           "broker's destination" in report
    read = report.split("## Every element and property read", 1)[1]
    rows = [line for line in read.splitlines() if line.startswith("| ")
            and not line.startswith("| element")]
    assert len(rows) > 100
    for row in rows:  # each says what the element became, or why it became nothing
        _, _, became, note = (c.strip() for c in row.strip("|").split(" | "))
        assert became != "—" or note, row


def test_input_cannot_become_code_or_settings(tmp_path: Path) -> None:
    # Descriptor text lands in the module's comments, its literals and the settings' strings.
    hostile = '"""\nopen("pwned", "w")\n#'
    ejb_jar = (f'<ejb-jar xmlns="{EJB_NAMESPACES["3.2"]}"><enterprise-beans><message-driven>'
               f"<ejb-name>Bad\u2028Bean</ejb-name><ejb-class>{hostile}</ejb-class>"
               + activation(("destinationType", "javax.jms.Topic"),
                            ("destination", "a/b\\c"), ("subscriptionName", hostile),
                            ("messageSelector", 'x = \'"\n\x7f\''))
               + "</message-driven></enterprise-beans></ejb-jar>").replace("&", "&amp;")
    (tmp_path / "ejb-jar.xml").write_text(ejb_jar)
    out = tmp_path / "out"
    out.mkdir()
    migrate([tmp_path / "ejb-jar.xml"], out)
    stubs = module(out)
    assert not (out / "pwned").exists() and not Path("pwned").exists()
    assert [spec.name for spec in map(spec_of, vars(stubs).values()) if spec] == ["bad_bean"]
    options = load_settings(out / "mdb.toml").listeners["bad_bean"].model_dump(exclude_unset=True)
    assert options["selector"] == 'x = \'"\n\x7f\''
    assert options["subscription"] == "____open__pwned____w____-{server}"
    assert str(spec_of(stubs.bad_bean).destination) == "topic:a.b_c"  # type: ignore[union-attr]


def test_comments_are_not_read_and_metadata_complete_turns_annotations_off(
        tmp_path: Path) -> None:
    source = weblogic_app.INVOICE_BEAN.replace(
        "public class", '// @MessageDriven(name = "Commented")\n/* @MessageDriven */\npublic class')
    (tmp_path / "InvoiceBean.java").write_text(source)
    out = tmp_path / "out"
    out.mkdir()
    migrate([tmp_path / "InvoiceBean.java"], out)
    assert list(load_settings(out / "mdb.toml").listeners) == ["invoice_bean"]
    complete = f'<ejb-jar xmlns="{EJB_NAMESPACES["3.1"]}" metadata-complete="true">' \
               "<enterprise-beans><message-driven><ejb-name>Other</ejb-name>" \
               "<mapped-name>jms/Other</mapped-name><message-destination-type>javax.jms.Queue" \
               "</message-destination-type></message-driven></enterprise-beans></ejb-jar>"
    (tmp_path / "ejb-jar.xml").write_text(complete)
    again = tmp_path / "again"
    again.mkdir()
    migrate([tmp_path / "ejb-jar.xml", tmp_path / "InvoiceBean.java"], again)
    assert list(load_settings(again / "mdb.toml").listeners) == ["other"]
    assert "| ignored: ejb-jar.xml is metadata-complete" in (
        again / "migration-report.md").read_text()


def test_a_bean_of_another_listener_interface_is_reported_not_migrated(tmp_path: Path) -> None:
    beans = "".join(
        f"<message-driven><ejb-name>{name}</ejb-name><messaging-type>{interface}"
        "</messaging-type><mapped-name>jms/In</mapped-name>"
        + activation(("destinationType", "javax.jms.Queue")) + "</message-driven>"
        for name, interface in (("MailBean", "javax.resource.cci.MessageListener"),
                                ("QueueBean", "jakarta.jms.MessageListener")))
    (tmp_path / "ejb-jar.xml").write_text(
        f'<ejb-jar xmlns="{EJB_NAMESPACES["4.0"]}"><enterprise-beans>{beans}'
        "</enterprise-beans></ejb-jar>")
    out = tmp_path / "out"
    out.mkdir()
    migrate([tmp_path / "ejb-jar.xml"], out)
    assert list(load_settings(out / "mdb.toml").listeners) == ["queue_bean"]
    report = (out / "migration-report.md").read_text()
    assert "| message-driven[MailBean]/messaging-type | javax.resource.cci.MessageListener | — " \
           "| a bean of another listener interface (a connector's) is not migrated" in report


def test_a_weblogic_bean_without_a_descriptor_is_of_the_kind_ejb_jar_says(
        tmp_path: Path) -> None:
    (tmp_path / "ejb-jar.xml").write_text(
        f'<ejb-jar xmlns="{EJB_NAMESPACES["3.2"]}"><enterprise-beans>'
        "<message-driven><ejb-name>Intake</ejb-name><mapped-name>jms/In</mapped-name>"
        "<message-destination-type>javax.jms.Queue</message-destination-type>"
        "</message-driven><session><ejb-name>Catalog</ejb-name></session>"
        "</enterprise-beans></ejb-jar>")
    timeout = "<transaction-descriptor><trans-timeout-seconds>20</trans-timeout-seconds>" \
              "</transaction-descriptor>"
    (tmp_path / "weblogic-ejb-jar.xml").write_text(
        f'<weblogic-ejb-jar xmlns="{WEBLOGIC_NAMESPACES["12"]}">'
        + "".join(f"<weblogic-enterprise-bean><ejb-name>{name}</ejb-name>{timeout}"
                  "</weblogic-enterprise-bean>" for name in ("Intake", "Catalog"))
        + "</weblogic-ejb-jar>")
    out = tmp_path / "out"
    out.mkdir()
    migrate([tmp_path / "ejb-jar.xml", tmp_path / "weblogic-ejb-jar.xml"], out)
    listeners = load_settings(out / "mdb.toml").listeners
    assert {name: o.model_dump(exclude_unset=True) for name, o in listeners.items()} == {
        "intake": {"handler_timeout": 20.0}}
    assert "| weblogic-enterprise-bean[Catalog]/transaction-descriptor/trans-timeout-seconds " \
           "| 20 | — | a setting of a session or entity bean: not migrated |" in (
               out / "migration-report.md").read_text()
