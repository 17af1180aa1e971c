"""Layer 6, a container served: the health endpoint and its one client (``http``), and
``mdb run`` as a process, with its supervisor of workers and its ``--reload``
watcher (``process``)."""
