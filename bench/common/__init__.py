"""What the benchmark scripts of ``bench/`` share: one script per path sits on top of these.

- :mod:`common.loadgen`: the closed loop every script drives its load with;
- :mod:`common.clients`: lean asyncio clients for HTTP/1.1, h2c, Redis (RESP2) and NATS;
- :mod:`common.processes`: servers run as child processes, their CPU and memory, event loops;
- :mod:`common.serve`: ``walstream serve`` as the HTTP benchmarks run it (deployment, stream,
  request body, another checkout's sources);
- :mod:`common.cli`: the options every script takes (``--quick``, ``--smoke``, ``--json``);
- :mod:`common.report`: tables, JSON, PNG plots and the statistics they are made of;
- :mod:`common.targets`: the performance targets and how each is read from the JSON;
- :mod:`common.profile`: py-spy profiles of the measured phases as top lists.

A script is run as ``python bench/NAME.py``, which puts ``bench/`` first on ``sys.path``, so
``common`` is imported as a top-level package (mypy checks it the same way, from ``bench/``).
"""
