"""What ``mdb migrate weblogic`` writes: the settings (``toml_values``, ``toml_writer``),
the module of ``@listener`` stubs (``module_writer``), the report (``report_writer``),
and the docs' mapping table (``mapping_table``)."""
