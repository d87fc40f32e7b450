"""``dipdeploy bench``: one benchmark tool in llama-bench's style, the front end's floor.

A suite runs a grid of configurations (comma lists expand to every combination, ``grid``), each repeated
round-robin, and reports one row schema (``rows``) as markdown, CSV or JSON, every file naming the
machine it ran on (``machine``). Suites: ``decode`` (prefill and decode tokens/s of the host runtime,
``decode``) and ``memory`` (residency and peaks under cgroup limits, each run in a process of its own:
``memory``, ``child``, ``cgroup``). Registry models are exported once per method and density into a
cache (``bundles``); scenario files keep a published table's flags (``scenario``).
"""
