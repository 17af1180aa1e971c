"""A WebLogic application as a team has it, written by the tests of ``mdb migrate weblogic``
(docs/migrating-from-weblogic.md, "The worked example"): four message-driven beans of a shop,
their ``ejb-jar.xml`` and ``weblogic-ejb-jar.xml`` (the namespaces of each EJB and WebLogic
version), a JMS module (``orders-jms.xml``: a uniform distributed queue and a partitioned
uniform distributed topic on three JMS servers, an error queue, a standalone queue, a
template, a connection factory), the domain's ``config.xml`` that says which JMS servers the
module's sub-deployment targets, an ``.ear`` holding an EJB ``.jar``, and the Java source of a
bean declared by annotations only.

* ``OrderIntakeBean``: the queue ``jms/Orders``, a pool of 8, transacted (Required);
* ``OrderAuditBean``: the topic ``jms/OrderEvents``, One-Copy-Per-Application, durable,
  subscription ``audit``;
* ``PriceCacheBean``: the same topic, One-Copy-Per-Server, durable;
* ``InvoiceBean`` (``@MessageDriven`` in ``InvoiceBean.java``): the queue
  ``jms/InvoiceRequests``, transacted, sends its invoices on to ``jms/Invoices``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

EJB_NAMESPACES = {
    "2.1": "http://java.sun.com/xml/ns/j2ee",
    "3.1": "http://java.sun.com/xml/ns/javaee",
    "3.2": "http://xmlns.jcp.org/xml/ns/javaee",
    "4.0": "https://jakarta.ee/xml/ns/jakartaee",
}
WEBLOGIC_NAMESPACES = {
    "9": "http://www.bea.com/ns/weblogic/90",
    "10.0": "http://www.bea.com/ns/weblogic/weblogic-ejb-jar",
    "12": "http://xmlns.oracle.com/weblogic/weblogic-ejb-jar",
}
JMS_NAMESPACE = "http://xmlns.oracle.com/weblogic/weblogic-jms"
DOMAIN_NAMESPACE = "http://xmlns.oracle.com/weblogic/domain"
JMS_SERVERS = ("JMSServer-1", "JMSServer-2", "JMSServer-3")
BROKERS = ("jms_server_1", "jms_server_2", "jms_server_3")
"""The mdb brokers the JMS servers become."""


def activation(*properties: tuple[str, str]) -> str:
    """An ``<activation-config>`` of ``properties`` (name, value)."""
    return "      <activation-config>\n" + "".join(
        f"        <activation-config-property>\n"
        f"          <activation-config-property-name>{name}"
        "</activation-config-property-name>\n"
        f"          <activation-config-property-value>{value}"
        "</activation-config-property-value>\n"
        "        </activation-config-property>\n" for name, value in properties
    ) + "      </activation-config>\n"


def ejb_jar(ejb: str = "3.2", extra_bean: str = "",
            extra_properties: tuple[tuple[str, str], ...] = ()) -> str:
    """The shop's ``ejb-jar.xml`` in the namespace of EJB ``ejb``; ``extra_bean`` is more
    elements of ``OrderIntakeBean``, ``extra_properties`` more activation properties of it."""
    jms = "jakarta.jms" if ejb == "4.0" else "javax.jms"
    intake = activation(("destinationType", f"{jms}.Queue"),
                        ("acknowledgeMode", "Auto-acknowledge"), *extra_properties)
    audit = activation(("destinationType", f"{jms}.Topic"), ("subscriptionDurability", "Durable"),
                       ("subscriptionName", "audit"),
                       ("topicMessagesDistributionMode", "One-Copy-Per-Application"))
    prices = activation(("destinationType", f"{jms}.Topic"),
                        ("subscriptionDurability", "Durable"),
                        ("topicMessagesDistributionMode", "One-Copy-Per-Server"))
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<ejb-jar xmlns="{EJB_NAMESPACES[ejb]}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         version="{ejb}">
  <display-name>shop-ejb</display-name>
  <enterprise-beans>
    <message-driven>
      <ejb-name>OrderIntakeBean</ejb-name>
      <ejb-class>com.shop.orders.OrderIntakeBean</ejb-class>
      <messaging-type>{jms}.MessageListener</messaging-type>
      <transaction-type>Container</transaction-type>
      <message-destination-type>{jms}.Queue</message-destination-type>
{intake}{extra_bean}      <resource-ref>
        <res-ref-name>jdbc/shop</res-ref-name>
        <res-type>javax.sql.DataSource</res-type>
      </resource-ref>
    </message-driven>
    <message-driven>
      <ejb-name>OrderAuditBean</ejb-name>
      <ejb-class>com.shop.audit.OrderAuditBean</ejb-class>
      <transaction-type>Container</transaction-type>
{audit}    </message-driven>
    <message-driven>
      <ejb-name>PriceCacheBean</ejb-name>
      <ejb-class>com.shop.prices.PriceCacheBean</ejb-class>
      <transaction-type>Container</transaction-type>
{prices}    </message-driven>
    <session>
      <ejb-name>CatalogBean</ejb-name>
      <ejb-class>com.shop.catalog.CatalogBean</ejb-class>
      <session-type>Stateless</session-type>
    </session>
  </enterprise-beans>
  <assembly-descriptor>
    <container-transaction>
      <method>
        <ejb-name>OrderIntakeBean</ejb-name>
        <method-name>onMessage</method-name>
      </method>
      <method>
        <ejb-name>OrderAuditBean</ejb-name>
        <method-name>*</method-name>
      </method>
      <method>
        <ejb-name>CatalogBean</ejb-name>
        <method-name>*</method-name>
      </method>
      <trans-attribute>Required</trans-attribute>
    </container-transaction>
  </assembly-descriptor>
</ejb-jar>
"""


def weblogic_ejb_jar(weblogic: str = "12", extra_descriptor: str = "") -> str:
    """The shop's ``weblogic-ejb-jar.xml`` in the namespace of WebLogic ``weblogic``;
    ``extra_descriptor`` is more of ``OrderIntakeBean``'s message-driven-descriptor."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<weblogic-ejb-jar xmlns="{WEBLOGIC_NAMESPACES[weblogic]}">
  <weblogic-enterprise-bean>
    <ejb-name>OrderIntakeBean</ejb-name>
    <message-driven-descriptor>
      <pool>
        <max-beans-in-free-pool>8</max-beans-in-free-pool>
        <initial-beans-in-free-pool>2</initial-beans-in-free-pool>
      </pool>
      <destination-jndi-name>jms/Orders</destination-jndi-name>
      <connection-factory-jndi-name>jms/ShopCF</connection-factory-jndi-name>
{extra_descriptor}      <init-suspend-seconds>2</init-suspend-seconds>
      <max-suspend-seconds>20</max-suspend-seconds>
    </message-driven-descriptor>
    <transaction-descriptor>
      <trans-timeout-seconds>45</trans-timeout-seconds>
    </transaction-descriptor>
    <dispatch-policy>OrdersWorkManager</dispatch-policy>
  </weblogic-enterprise-bean>
  <weblogic-enterprise-bean>
    <ejb-name>OrderAuditBean</ejb-name>
    <message-driven-descriptor>
      <destination-jndi-name>jms/OrderEvents</destination-jndi-name>
      <connection-factory-jndi-name>jms/ShopCF</connection-factory-jndi-name>
      <distributed-destination-connection>EveryMember</distributed-destination-connection>
    </message-driven-descriptor>
  </weblogic-enterprise-bean>
  <weblogic-enterprise-bean>
    <ejb-name>PriceCacheBean</ejb-name>
    <message-driven-descriptor>
      <pool>
        <max-beans-in-free-pool>2</max-beans-in-free-pool>
      </pool>
      <destination-jndi-name>jms/OrderEvents</destination-jndi-name>
      <jms-client-id>prices</jms-client-id>
    </message-driven-descriptor>
  </weblogic-enterprise-bean>
  <weblogic-enterprise-bean>
    <ejb-name>InvoiceBean</ejb-name>
    <message-driven-descriptor>
      <max-messages-in-transaction>4</max-messages-in-transaction>
    </message-driven-descriptor>
  </weblogic-enterprise-bean>
  <weblogic-enterprise-bean>
    <ejb-name>CatalogBean</ejb-name>
    <stateless-session-descriptor>
      <pool><max-beans-in-free-pool>10</max-beans-in-free-pool></pool>
    </stateless-session-descriptor>
  </weblogic-enterprise-bean>
</weblogic-ejb-jar>
"""


def jms_module(forwarding: str = "Partitioned", extra_topic: str = "") -> str:
    """The shop's JMS module, ``orders-jms.xml``."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<weblogic-jms xmlns="{JMS_NAMESPACE}">
  <connection-factory name="ShopCF">
    <sub-deployment-name>ShopServers</sub-deployment-name>
    <jndi-name>jms/ShopCF</jndi-name>
    <client-params>
      <client-id-policy>Unrestricted</client-id-policy>
      <subscription-sharing-policy>Sharable</subscription-sharing-policy>
      <messages-maximum>4</messages-maximum>
      <reconnect-policy>all</reconnect-policy>
      <reconnect-blocking-millis>30000</reconnect-blocking-millis>
    </client-params>
    <transaction-params>
      <xa-connection-factory-enabled>true</xa-connection-factory-enabled>
    </transaction-params>
  </connection-factory>
  <template name="ShopTemplate">
    <delivery-params-overrides>
      <redelivery-delay>2000</redelivery-delay>
    </delivery-params-overrides>
    <delivery-failure-params>
      <redelivery-limit>3</redelivery-limit>
      <expiration-policy>Redirect</expiration-policy>
    </delivery-failure-params>
  </template>
  <uniform-distributed-queue name="Orders">
    <sub-deployment-name>ShopServers</sub-deployment-name>
    <template>ShopTemplate</template>
    <delivery-failure-params>
      <error-destination>OrdersError</error-destination>
    </delivery-failure-params>
    <jndi-name>jms/Orders</jndi-name>
  </uniform-distributed-queue>
  <uniform-distributed-queue name="OrdersError">
    <sub-deployment-name>ShopServers</sub-deployment-name>
    <jndi-name>jms/OrdersError</jndi-name>
  </uniform-distributed-queue>
  <uniform-distributed-topic name="OrderEvents">
    <sub-deployment-name>ShopServers</sub-deployment-name>
    <template>ShopTemplate</template>
    <jndi-name>jms/OrderEvents</jndi-name>
    <forwarding-policy>{forwarding}</forwarding-policy>
{extra_topic}  </uniform-distributed-topic>
  <queue name="InvoiceRequests">
    <sub-deployment-name>FirstServer</sub-deployment-name>
    <jndi-name>jms/InvoiceRequests</jndi-name>
    <thresholds><bytes-high>100000000</bytes-high></thresholds>
  </queue>
  <queue name="Invoices">
    <sub-deployment-name>FirstServer</sub-deployment-name>
    <jndi-name>jms/Invoices</jndi-name>
  </queue>
</weblogic-jms>
"""


def domain() -> str:
    """The domain's ``config.xml``: three managed servers of a cluster, one JMS server on
    each, and the JMS system resource of ``orders-jms.xml`` with its sub-deployments."""
    servers = "".join(
        f"""  <server>
    <name>shop-{n}</name>
    <listen-address>shop-{n}.example.com</listen-address>
    <listen-port>7001</listen-port>
    <cluster>shop-cluster</cluster>
  </server>
""" for n in (1, 2, 3))
    jms_servers = "".join(
        f"""  <jms-server>
    <name>{name}</name>
    <target>shop-{n}</target>
    <persistent-store>FileStore-{n}</persistent-store>
  </jms-server>
""" for n, name in enumerate(JMS_SERVERS, 1))
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<domain xmlns="{DOMAIN_NAMESPACE}">
  <name>shop_domain</name>
  <domain-version>14.1.1.0.0</domain-version>
{servers}  <cluster>
    <name>shop-cluster</name>
  </cluster>
{jms_servers}  <jms-system-resource>
    <name>ShopModule</name>
    <target>shop-cluster</target>
    <sub-deployment>
      <name>ShopServers</name>
      <target>{",".join(JMS_SERVERS)}</target>
    </sub-deployment>
    <sub-deployment>
      <name>FirstServer</name>
      <target>{JMS_SERVERS[0]}</target>
    </sub-deployment>
    <descriptor-file-name>jms/orders-jms.xml</descriptor-file-name>
  </jms-system-resource>
  <admin-server-name>AdminServer</admin-server-name>
</domain>
"""


INVOICE_BEAN = """package com.shop.billing;

import javax.ejb.ActivationConfigProperty;
import javax.ejb.MessageDriven;
import javax.ejb.TransactionAttribute;
import javax.ejb.TransactionAttributeType;
import javax.jms.Message;
import javax.jms.MessageListener;

/** Invoices each order it is asked to: sends the invoice on, in the same transaction. */
@MessageDriven(
    name = "InvoiceBean",
    mappedName = "jms/InvoiceRequests",
    activationConfig = {
        // A queue: each request is invoiced once.
        @ActivationConfigProperty(propertyName = "destinationType",
                                  propertyValue = "javax.jms.Queue"),
        @ActivationConfigProperty(propertyName = "connectionFactoryJndiName",
                                  propertyValue = "jms/" + "ShopCF")
    })
public class InvoiceBean implements MessageListener {

    @TransactionAttribute(TransactionAttributeType.REQUIRED)
    public void onMessage(Message message) {
        /* look the order up, send the invoice to jms/Invoices */
    }
}
"""


def write_sources(folder: Path, *, ejb: str = "3.2", weblogic: str = "12",
                  forwarding: str = "Partitioned") -> dict[str, Path]:
    """The application as a team keeps it: ``shop.ear`` (its EJB module ``shop-ejb.jar``
    with both descriptors), ``src/`` (the Java source of InvoiceBean) and the domain folder
    (``config/config.xml``, ``config/jms/orders-jms.xml``); their paths, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / "shop-ejb.jar"
    with zipfile.ZipFile(module, "w") as jar:
        jar.writestr("META-INF/ejb-jar.xml", ejb_jar(ejb))
        jar.writestr("META-INF/weblogic-ejb-jar.xml", weblogic_ejb_jar(weblogic))
        jar.writestr("com/shop/orders/OrderIntakeBean.class", b"\xca\xfe\xba\xbe")
    ear = folder / "shop.ear"
    with zipfile.ZipFile(ear, "w") as archive:
        archive.write(module, "shop-ejb.jar")
        archive.writestr("META-INF/application.xml", "<application/>")
        archive.writestr("lib/commons.jar", b"not read")
    module.unlink()
    source = folder / "src" / "com" / "shop" / "billing" / "InvoiceBean.java"
    source.parent.mkdir(parents=True)
    source.write_text(INVOICE_BEAN)
    (folder / "src" / "com" / "shop" / "billing" / "Invoice.java").write_text(
        "package com.shop.billing;\npublic class Invoice {}\n")
    jms = folder / "domain" / "config" / "jms" / "orders-jms.xml"
    jms.parent.mkdir(parents=True)
    jms.write_text(jms_module(forwarding))
    (folder / "domain" / "config" / "config.xml").write_text(domain())
    return {"ear": ear, "src": folder / "src", "domain": folder / "domain"}
