"""The local proxy behind ``ctxwarden wrap``: a data dir, one local tenant, and a
``ctxwarden serve`` in the background that later runs reuse (R20).

- :mod:`.home`: where the embedded store and the state files live;
- :mod:`.tenant`: the local tenant, created once, its key kept in the data dir;
- :mod:`.server`: start a background ``serve``, or find the running one for the same
  configuration (a state file per configuration, checked alive before reuse);
- :mod:`.agent_env`: the environment the wrapped command runs in, and where the
  server's upstreams come from;
- :mod:`.proxy`: all of the above for one run (:func:`~.proxy.local_proxy`);
- :mod:`.report`: what the run's calls cost and saved, read from the store.
"""
