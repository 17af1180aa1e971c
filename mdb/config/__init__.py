"""Layer 1, configuration: a deployment's settings (``settings``), a broker's
(``broker_settings``), a database's (``database_settings``), and the configuration
reference made from them (``reference``, docs/configuration.md)."""
