"""What ``mdb migrate weblogic`` reads: archives, folders and files (``inputs``), XML
parsed safely and walked against a table (``xml_reading``), and one reader per format
(``ejb_jar``, ``weblogic_ejb_jar``, ``java_sources``, ``jms_module``, ``domain``;
``activation`` for the activation properties)."""
