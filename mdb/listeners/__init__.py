"""Layer 1, the application's API: ``@listener`` and its spec (``listener``), every
listener option declared once (``options``), what a handler knows and sends
(``context``), availability events and ``@on_event`` (``events``)."""
