"""``mdb console``: one process serving the operator's web page of a fleet of containers
(docs/console.md).

* ``command``: the command, wiring the parts below on one event loop;
* ``poller``: reads every container's ``/status``, keeps 15 minutes of its counters;
* ``router``: the routes, GET and POST, their bounds and headers;
* ``auth``: the login with the control token, the session cookie and its CSRF token;
* ``pages``: the layout around every page; ``fleet_pages`` and ``charts``: the fleet, its
  listeners and databases; ``failed_pages``: the failed messages;
* ``html``: the one escape every value shown goes through.
"""
