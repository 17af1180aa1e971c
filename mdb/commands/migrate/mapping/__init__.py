"""What was read, mapped to mdb: names (``names``), the brokers, destinations and their
members (``topology``), and one listener per bean (``listeners``, which runs the steps of
``destination_steps`` and ``option_steps`` on a ``bean_mapping.BeanMapping``; what a setting's
text means is ``found_values``)."""
