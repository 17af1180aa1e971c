"""Layer 7, the ``mdb`` command (``cli``) and what it runs: ``mdb dlq`` (``dlq``),
``mdb asyncapi`` (``asyncapi``) and ``mdb migrate`` (``migrate``)."""
