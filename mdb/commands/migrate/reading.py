"""Every input read into one ``Application``: the descriptors first, each told by its root
element, then the Java sources (their annotations lose to the descriptors, and are not read
at all where an ``ejb-jar.xml`` is metadata-complete); then what must hold across the
files: each bean described is defined, and each container transaction finds its bean."""

from __future__ import annotations

from collections.abc import Sequence

from mdb import ConfigurationError
from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import Source
from mdb.commands.migrate.descriptors import (
    domain,
    ejb_jar,
    java_sources,
    jms_module,
    weblogic_ejb_jar,
)
from mdb.commands.migrate.descriptors.inputs import Input
from mdb.commands.migrate.descriptors.xml_reading import local, parse
from mdb.commands.migrate.model import Rule

_DESCRIPTORS = "ejb-jar, weblogic-ejb-jar, weblogic-jms (a JMS module) or domain (config.xml)"


def read(inputs: Sequence[Input]) -> Application:
    """The application ``inputs`` describe; ConfigurationError, one line, for input mdb
    migrate cannot read or that contradicts itself, and when it holds no bean."""
    app = Application()
    for item in sorted(inputs, key=lambda i: i.java):  # descriptors first
        if item.java:
            count = java_sources.read(item.data.decode("utf-8", "replace"), item.file, app)
            if count:
                app.read.append((item.file, f"Java source: {count} @MessageDriven"))
            elif item.named:
                raise ConfigurationError(f"{item.file}: declares no @MessageDriven bean; name "
                                         "the sources of the message-driven beans")
            continue
        root = parse(item.data, item.file)
        kind = local(root)
        if kind == "ejb-jar":
            app.read.append((item.file, f"ejb-jar.xml, {ejb_jar.read(root, item.file, app)}"))
        elif kind == "weblogic-ejb-jar":
            found = weblogic_ejb_jar.read(root, item.file, app)
            app.read.append((item.file, f"weblogic-ejb-jar.xml, {found}"))
        elif kind == "weblogic-jms":
            module = jms_module.read(root, item.file, app.report)
            app.modules.append(module)
            app.read.append((item.file, f"JMS module, {module.version}"))
        elif kind == "domain":
            if app.domain is not None:
                raise ConfigurationError(f"{item.file}: a second domain's config.xml (the first "
                                         f"is {app.domain.file}); give the one domain the "
                                         "application is deployed in")
            app.domain = domain.read(root, item.file, app.report)
            app.read.append((item.file, f"config.xml, {app.domain.version}"))
        else:
            raise ConfigurationError(f"{item.file}: <{kind}> is not a descriptor mdb migrate "
                                     f"reads ({_DESCRIPTORS}); name those files, or the archive "
                                     "or folder holding them")
    _transactions(app)
    _check(app, inputs)
    return app


def _transactions(app: Application) -> None:
    """Give each bean the trans-attribute of its onMessage (a method ``*`` is every method;
    ``onMessage``'s own beats it)."""
    ordered = sorted(app.transactions, key=lambda t: t[1] == "*")
    for ejb_name, method, found in ordered:
        bean = app.beans.get(ejb_name)
        if ejb_name not in app.defined or bean is None:
            app.report.none(found, Rule(instead="the transaction of a session or entity "
                                                "bean's method: not migrated"))
        elif method not in ("onMessage", "*"):
            app.report.none(found, Rule(instead="a method other than onMessage: nothing to "
                                                "migrate"))
        elif method == "*" and "transAttribute" in bean.settings:
            app.report.none(found, Rule(instead="onMessage has its own attribute"))
        else:
            bean.give("transAttribute", Source.EJB_JAR, found, app.report)


def _check(app: Application, inputs: Sequence[Input]) -> None:
    for name, found in list(app.described.items()):
        if name in app.not_listeners and name not in app.defined:
            # weblogic-ejb-jar.xml's settings of a session or entity bean, which said
            # nothing of its kind there
            rule = Rule(instead="a setting of a session or entity bean: not migrated")
            for _, setting in app.beans.pop(name).settings.values():
                app.report.none(setting, rule)
            app.report.none(app.described.pop(name), rule)
        elif name not in app.defined:
            raise found.refuse(
                f"describes bean {name}, which no ejb-jar.xml <message-driven> nor "
                "@MessageDriven source defines",
                "give its ejb-jar.xml or its Java sources (a .class file is not read)")
    if not app.defined:
        shown = ", ".join(sorted({i.file.partition("!")[0] for i in inputs})) or "nothing"
        raise ConfigurationError(
            f"no message-driven bean in {shown}: name the application's archive (.ear, "
            ".jar), its descriptors (ejb-jar.xml, weblogic-ejb-jar.xml) or the Java sources "
            "of its @MessageDriven beans")
