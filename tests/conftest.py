"""Settings for every test process of the suite.

Dynamo measures each new guard set's evaluation time once, after flushing the CPU caches
(``torch._dynamo.guards``: ``profile_guard_manager``, reported as the compile metric ``guard_latency_us``).
Here that costs ~23 ms per Dynamo compile, as much as the rest of Dynamo's work on a small graph, and the
suite compiles thousands of graphs (~10% of its time). No test reads the metric; the guards are still built,
checked against the frame that made them and evaluated on every call. Processes the tests start (examples,
torchrun ranks, warm starts) run unpatched.
"""

from __future__ import annotations

import torch._dynamo.guards as _dynamo_guards

if hasattr(_dynamo_guards, "profile_guard_manager"):
    _dynamo_guards.profile_guard_manager = lambda *args, **kwargs: 0.0
