"""Every element, activation property and annotation of the mapping table
(docs/migrating-from-weblogic.md, "The mapping, element by element") migrated: the shop of
``tests.harness.apps.weblogic_app`` with every element of each descriptor added, a standard
Jakarta EE ``ejb-jar.xml`` with every activation property on four beans (the resource
adapters' too), and a source with every annotation. Each is in the report with an outcome,
and the docs hold the table as the code declares it."""

from __future__ import annotations

import re
from pathlib import Path

from mdb import Redelivery, load_settings
from mdb.commands.migrate.command import migrate
from mdb.commands.migrate.descriptors import domain, ejb_jar, jms_module, weblogic_ejb_jar
from mdb.commands.migrate.descriptors.activation import PROPERTIES
from mdb.commands.migrate.descriptors.java_sources import ANNOTATIONS
from mdb.commands.migrate.descriptors.xml_reading import Read, Table
from mdb.commands.migrate.model import Rule
from mdb.commands.migrate.writers import mapping_table
from mdb.config.broker_settings import BrokerSettings
from mdb.listeners.options import ListenerOptions
from tests.harness.apps import weblogic_app
from tests.harness.apps.weblogic_app import activation

ROOT = Path(__file__).resolve().parents[2]
TABLES = {f"{reader.__name__.rpartition('.')[2]}/{parent}": table
          for reader in (ejb_jar, weblogic_ejb_jar, jms_module, domain)
          for parent, table in reader.TABLES}
"""Every table of the readers, by ``reader/parent``."""


def elements(table: Table) -> str:
    """An element for each entry of ``table`` that has no equivalent (any content does)."""
    return "".join(f"<{name}>x</{name}>\n" for name, entry in table.items()
                   if isinstance(entry, Rule) and not name.startswith("("))


def the_whole_shop(folder: Path) -> list[Path]:
    ejb_jar = weblogic_app.ejb_jar(extra_bean=elements(TABLES["ejb_jar/message-driven"])).replace(
        "<enterprise-beans>", elements(TABLES["ejb_jar/ejb-jar"]) + "<enterprise-beans>\n"
        "<entity><ejb-name>Ledger</ejb-name></entity>\n"
        "<message-driven><ejb-name>LinkedBean</ejb-name><message-destination-link>Invoices</message-destination-link>"
        "<activation-config><description>the bean's</description></activation-config>"
        "</message-driven>\n"
    ).replace("<ejb-name>PriceCacheBean</ejb-name>", "<ejb-name>PriceCacheBean</ejb-name>"
              "<mapped-name>jms/OrderEvents</mapped-name>").replace(
        "<assembly-descriptor>",
        "<assembly-descriptor>\n" + elements(TABLES["ejb_jar/assembly-descriptor"])
        + "<message-destination><description>d"
        "</description><display-name>n</display-name><icon>i</icon><message-destination-name>"
        "Invoices</message-destination-name><mapped-name>jms/Invoices</mapped-name>"
        "<lookup-name>jms/Invoices</lookup-name></message-destination>\n")
    every_descriptor_element = (
        "<timer-descriptor>x</timer-descriptor><initial-context-factory>x"
        "</initial-context-factory><provider-url>t3://x</provider-url>"
        "<resource-adapter-jndi-name>ra</resource-adapter-jndi-name>"
        "<jms-polling-interval-seconds>9</jms-polling-interval-seconds>"
        "<use81-style-polling>false</use81-style-polling><security-plugin>x</security-plugin>\n")
    bean_table = TABLES["weblogic_ejb_jar/weblogic-enterprise-bean"]
    # the descriptors of session and entity beans, each on a bean of its own
    kinds = [name for name, entry in bean_table.items()
             if entry == bean_table["entity-descriptor"]]
    weblogic = weblogic_app.weblogic_ejb_jar(extra_descriptor=every_descriptor_element).replace(
        "<dispatch-policy>", elements({n: e for n, e in bean_table.items() if n not in kinds})
        + "<dispatch-policy>").replace(
        "</weblogic-ejb-jar>", "".join(
            f"<weblogic-enterprise-bean><ejb-name>Other{n}</ejb-name><{kind}/>"
            "</weblogic-enterprise-bean>" for n, kind in enumerate(kinds)) + "</weblogic-ejb-jar>"
    ).replace(
        "<initial-beans-in-free-pool>", "<idle-timeout-seconds>60</idle-timeout-seconds>"
        "<initial-beans-in-free-pool>").replace(
        "<weblogic-enterprise-bean>", elements(TABLES["weblogic_ejb_jar/weblogic-ejb-jar"])
        + "<message-destination-descriptor><message-destination-name>Invoices"
        "</message-destination-name><destination-jndi-name>jms/Invoices</destination-jndi-name>"
        "<initial-context-factory>x</initial-context-factory><provider-url>x</provider-url>"
        "</message-destination-descriptor><message-destination-descriptor>"
        "<message-destination-name>Audit</message-destination-name><destination-resource-link>"
        "ShopModule#OrderEvents</destination-resource-link></message-destination-descriptor>\n"
        "<weblogic-enterprise-bean>", 1).replace(
        "<ejb-name>InvoiceBean</ejb-name>\n    <message-driven-descriptor>",
        "<ejb-name>InvoiceBean</ejb-name>\n    <message-driven-descriptor>"
        "<destination-resource-link>ShopModule#InvoiceRequests</destination-resource-link>"
        "<connection-factory-resource-link>ShopCF</connection-factory-resource-link>").replace(
        "<ejb-name>PriceCacheBean</ejb-name>\n    <message-driven-descriptor>",
        "<ejb-name>PriceCacheBean</ejb-name>\n    <message-driven-descriptor>"
        "<generate-unique-jms-client-id>true</generate-unique-jms-client-id>"
        "<durable-subscription-deletion>true</durable-subscription-deletion>"
        "<topic-messages-distribution-mode>One-Copy-Per-Server"
        "</topic-messages-distribution-mode>")
    factory = (elements(TABLES["jms_module/client-params"])
               + "<client-id>shop</client-id><total-reconnect-period-millis>60000"
                 "</total-reconnect-period-millis>")
    jms = weblogic_app.jms_module(extra_topic=elements(
        TABLES["jms_module/queue, topic and their distributed kinds"])).replace(
        "<client-params>", "<client-params>" + factory).replace(
        "<transaction-params>", "<notes>n</notes><local-jndi-name>ShopCF</local-jndi-name>"
        + "<default-delivery-params>" + elements(TABLES["jms_module/default-delivery-params"])
        + "<default-redelivery-delay>500</default-redelivery-delay></default-delivery-params>"
        + elements(TABLES["jms_module/connection-factory"]) + "<transaction-params>"
        + elements(TABLES["jms_module/transaction-params"])).replace(
        "<template name=\"ShopTemplate\">", "<template name=\"ShopTemplate\">"
        + elements(TABLES["jms_module/template"])).replace(
        "<expiration-policy>", elements(TABLES["jms_module/delivery-failure-params"])
        + "<expiration-policy>").replace(
        "<redelivery-delay>2000</redelivery-delay>", "<redelivery-delay>2000</redelivery-delay>"
        + elements(TABLES["jms_module/delivery-params-overrides"])).replace(
        "<queue name=\"Invoices\">", elements(TABLES["jms_module/weblogic-jms"])
        + "<topic name=\"T1\"><sub-deployment-name>FirstServer</sub-deployment-name></topic>"
          "<topic name=\"T2\"><sub-deployment-name>FirstServer</sub-deployment-name></topic>"
          "<distributed-topic name=\"Weighted\"><jndi-name>jms/Weighted</jndi-name>"
          "<distributed-topic-member name=\"m1\"><weight>1</weight><notes>n</notes>"
          "<physical-destination-name>T1</physical-destination-name>"
          "</distributed-topic-member><distributed-topic-member name=\"m2\">"
          "<physical-destination-name>T2</physical-destination-name>"
          "</distributed-topic-member></distributed-topic>"
          "<distributed-queue name=\"WeightedQueue\"><distributed-queue-member name=\"m\">"
          "<physical-destination-name>Invoices</physical-destination-name>"
          "</distributed-queue-member></distributed-queue>"
          "<queue name=\"Invoices\">")
    files = {"META-INF/ejb-jar.xml": ejb_jar, "META-INF/weblogic-ejb-jar.xml": weblogic,
             "domain/config/jms/orders-jms.xml": jms,
             "domain/config/config.xml": weblogic_app.domain(),
             "src/InvoiceBean.java": weblogic_app.INVOICE_BEAN}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return [folder]


PROPERTY_BEANS = {  # the beans of a standard ejb-jar.xml that hold every activation property
    "QueueBean": {"destinationType": "javax.jms.Queue", "destination": "shop.q1",
                  "connectionFactoryLookup": "jms/CF", "messageSelector": "region = 'eu'",
                  "acknowledgeMode": "Dups-ok-acknowledge", "maxSessions": "3",
                  "maxMessagesPerSessions": "2", "enableBatch": "true",
                  "maxMessagesPerBatch": "5", "maximumRedeliveries": "4",
                  "initialRedeliveryDelay": "500", "redeliveryBackOffMultiplier": "3",
                  "redeliveryUseExponentialBackOff": "true", "useRAManagedTransaction": "true",
                  "noLocal": "false", "userName": "shop", "password": "secret",
                  "useJndi": "false", "resourceAdapterJndiName": "activemq-ra"},
    "TopicBean": {"destinationType": "javax.jms.Topic", "destinationLookup": "jms/t2",
                  "subscriptionDurability": "NonDurable", "subscriptionName": "s2",
                  "clientId": "c2", "generateUniqueJmsClientId": "true",
                  "durableSubscriptionDeletion": "true",
                  "distributedDestinationConnection": "LocalOnly", "initSuspendSeconds": "1",
                  "maxSuspendSeconds": "5", "jmsPollingIntervalSeconds": "7",
                  "providerURL": "t3://wls:7001",
                  "initialContextFactory": "weblogic.jndi.WLInitialContextFactory",
                  "connectionFactoryJndiName": "jms/CF2"},
    "SharedBean": {"destinationType": "jakarta.jms.Topic", "destinationJndiName": "jms/t3",
                   "topicMessagesDistributionMode": "One-Copy-Per-Application",
                   "jmsClientId": "c3", "connectionFactoryResourceLink": "m#cf",
                   "maxMessagesInTransaction": "2", "maxSession": "2", "user": "u3",
                   "shareSubscriptions": "true", "setupAttempts": "3", "setupInterval": "1000",
                   "rebalanceConnections": "true", "connectorClassName": "x",
                   "connectionParameters": "host=a"},
    "LinkBean": {"destinationType": "javax.jms.Queue", "destinationResourceLink": "m#q4"},
}

EVERY_ANNOTATION = """package shop;
@MessageDriven(name = "AnnotatedBean", mappedName = "jms/annotated",
               messageListenerInterface = javax.jms.MessageListener.class,
               description = "every annotation",
               activationConfig = {@ActivationConfigProperty(propertyName = "destinationType",
                                                              propertyValue = "javax.jms.Queue")})
@TransactionManagement(TransactionManagementType.BEAN)
@weblogic.javaee.TransactionTimeoutSeconds(30)
public class AnnotatedBean implements MessageListener {
    @TransactionAttribute(TransactionAttributeType.NOT_SUPPORTED)
    public void onMessage(Message m) {}
}
"""


def the_standard_ones(folder: Path) -> list[Path]:
    beans = "".join(
        f"<message-driven><ejb-name>{name}</ejb-name>{activation(*properties.items())}"
        "</message-driven>\n" for name, properties in PROPERTY_BEANS.items())
    (folder / "ejb-jar.xml").write_text(
        f'<ejb-jar xmlns="{weblogic_app.EJB_NAMESPACES["4.0"]}"><enterprise-beans>{beans}'
        "</enterprise-beans></ejb-jar>")
    (folder / "AnnotatedBean.java").write_text(EVERY_ANNOTATION)
    return [folder / "ejb-jar.xml", folder / "AnnotatedBean.java"]


def report_of(tmp_path: Path, name: str, inputs: list[Path]) -> tuple[str, Path]:
    out = tmp_path / name
    out.mkdir()
    migrate(inputs, out)
    return (out / "migration-report.md").read_text(), out


def read_names(report: str) -> set[str]:
    """Every element, property and annotation a report has a row of."""
    names: set[str] = set()
    for row in report.split("## Every element and property read", 1)[1].splitlines():
        if not row.startswith("| ") or row.startswith("| element"):
            continue
        element = row.strip("|").split(" | ")[0].strip()
        element = re.sub(r"^line \d+: ", "", element).split(" of ")[0]
        names.update(re.findall(r"\[([A-Za-z]+)\]", element))  # activation properties
        names.update(re.sub(r"\[.*?\]", "", part) for part in element.split("/"))
    return names


def test_every_element_property_and_annotation_is_migrated_and_reported(
        tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "standard").mkdir()
    shop, _ = report_of(tmp_path, "out_shop", the_whole_shop(tmp_path / "shop"))
    standard, out = report_of(tmp_path, "out_standard", the_standard_ones(tmp_path / "standard"))
    found = read_names(shop) | read_names(standard)
    # Every row of the mapping table (a container without a rule of its own is no row).
    expected = {name for table in TABLES.values() for name, entry in table.items()
                if not (isinstance(entry, Read) and entry.rule is None)}
    expected |= {name for group in PROPERTIES.values() for name in group}
    expected |= {name.replace("the class", "the class AnnotatedBean") for name in ANNOTATIONS}
    # A domain's servers give the brokers' hosts: test_migrate_weblogic checks the URLs.
    expected -= {"server", "(any other element)"}
    found = {name.replace("@weblogic.javaee.", "@") for name in found}
    assert expected - found == set()
    assert "(other elements)" in found
    listeners = load_settings(out / "mdb.toml").listeners
    assert listeners["queue_bean"].model_dump(exclude_unset=True) == {
        "selector": "region = 'eu'", "pool": 3, "prefetch": 2,
        "max_messages_per_transaction": 5,
        "redelivery": {"limit": 4, "delay": 0.5, "backoff": 3.0}}
    assert listeners["topic_bean"].model_dump(exclude_unset=True) == {
        "distribution": "one-copy-per-server", "subscription": "c2_s2-{server}",
        "durable_subscription_deletion": True}
    assert listeners["shared_bean"].model_dump(exclude_unset=True) == {
        "distribution": "one-copy-per-app", "subscription": "c3_SharedBean", "pool": 2,
        "max_messages_per_transaction": 2}
    assert listeners["annotated_bean"].model_dump(exclude_unset=True) == {
        "transacted": False, "handler_timeout": 30.0}


def test_the_docs_hold_the_mapping_table_the_code_declares() -> None:
    page = (ROOT / "docs" / "migrating-from-weblogic.md").read_text()
    assert mapping_table.markdown() in page, (
        "docs/migrating-from-weblogic.md lacks the current mapping table: paste the output "
        "of `python -m mdb.commands.migrate.writers.mapping_table` into its section")


def test_the_worked_example_of_the_docs_migrates_to_what_the_docs_show(tmp_path: Path) -> None:
    # A reader copies the files of the page: what the page shows must be what they get.
    page = (ROOT / "docs" / "migrating-from-weblogic.md").read_text()
    example = page.split("## The worked example", 1)[1].split("## Jakarta EE", 1)[0]
    files = re.findall(r"^`([\w/.-]+)`(?: \(the part the migration reads\))?:\n\n```\w+\n"
                       r"(.*?)\n```", example, flags=re.M | re.S)
    assert [name for name, _ in files] == [
        "src/main/resources/META-INF/ejb-jar.xml",
        "src/main/resources/META-INF/weblogic-ejb-jar.xml",
        "src/main/java/com/acme/payments/ReceiptBean.java",
        "domain/config/jms/payments-jms.xml", "domain/config/config.xml"]
    for name, text in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    out = tmp_path / "migrated"
    out.mkdir()
    said = migrate([tmp_path / "src" / "main", tmp_path / "domain"], out, app="payments")
    assert said.replace(str(out), "migrated") in example
    written = (out / "mdb.toml").read_text()
    shown = example.split("`migrated/mdb.toml`, in part:\n\n```toml\n", 1)[1].split("```")[0]
    for line in shown.splitlines():
        assert line in written, line
    for row in example.split("and the report, in part:\n\n```\n", 1)[1].split("```")[0] \
            .splitlines():
        assert row in (out / "migration-report.md").read_text(), row


def test_every_setting_the_mapping_names_is_one_mdb_declares() -> None:
    # The table names mdb's settings in its text: a renamed option must not leave it stale.
    table = mapping_table.markdown()
    options = set(ListenerOptions.model_fields)
    for option, inner in re.findall(r"listeners\.NAME\.(\w+)(?:\.(\w+))?", table):
        assert option in options, option
        assert not inner or inner in Redelivery.model_fields, inner
    for setting in re.findall(r"brokers\.B\.(\w+)", table):
        assert setting in BrokerSettings.model_fields, setting
    assert re.findall(r"listeners\.NAME\.\w+", table) and re.findall(r"brokers\.B\.\w+", table)
