"""What the text of a setting read from an input means, for the mapping: a boolean, a whole or
positive number, one of a few choices (its case and punctuation aside), whether it names a
resource by its link; and why mdb's own declaration refuses a value (``why_refused``). A text
the input's own schema refuses stops the migration (``Found.refuse``).
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from mdb.commands.migrate.model import Found

BOOLEANS = {**dict.fromkeys(("true", "yes", "y", "1"), True),
             **dict.fromkeys(("false", "no", "n", "0"), False)}


def why_refused(model: type[BaseModel], field_name: str, item: object) -> str:
    """Why mdb's declaration ``model`` refuses ``item`` for ``field_name``, or ``""``."""
    try:
        model.model_validate({field_name: item})
    except ValidationError as exc:
        return "; ".join(str(error["msg"]) for error in exc.errors(include_url=False))
    return ""


def origin_of(found: Found) -> str:
    return f"<{found.element}> of {found.file.rpartition('!')[2].rpartition('/')[2]}"


def jms_listener(interface: str) -> bool:
    return interface.removesuffix(".class") in (
        "MessageListener", "javax.jms.MessageListener", "jakarta.jms.MessageListener")


def is_resource_link(found: Found) -> bool:
    """Whether ``found`` names a module's resource by its name (WebLogic's ...-resource-link)
    rather than by a JNDI name."""
    return "resourcelink" in found.element.lower().replace("-", "")


def normal(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def choice(found: Found, choices: dict[str, str],
            refused: tuple[str, str] | None = None) -> str:
    """The choice ``found`` makes, its case, spaces, dots, dashes and underscores aside."""
    chosen = choices.get(normal(found.value))
    if chosen is None:
        problem, fix = refused or ("not a value allowed here",
                                   f"write one of {', '.join(sorted(set(choices.values())))}")
        raise found.refuse(problem, fix)
    return chosen


def boolean(found: Found) -> bool:
    if found.value.lower() not in BOOLEANS:
        raise found.refuse("not a boolean", "write true or false")
    return BOOLEANS[found.value.lower()]


def whole(found: Found, least: int) -> int:
    text = found.value
    if not text.lstrip("-").isdigit() or int(text) < least:
        raise found.refuse("not a whole number" + (f" of at least {least}" if least else ""),
                           "write one" + (" (-1 for none)" if least == -1 else ""))
    return int(text)


def number(found: Found) -> float:
    try:
        number = float(found.value)
    except ValueError:
        number = -1.0
    if not 0 < number < float("inf"):
        raise found.refuse("not a positive number", "write one")
    return number
