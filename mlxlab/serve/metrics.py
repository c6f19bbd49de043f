"""The server's Prometheus metrics (``/metrics``, through ``prometheus-client``), named as vLLM
names them (with an ``mlxlab:`` prefix where vLLM has ``vllm:``) and labelled by tenant.

Latency histograms are observed on the engine's clock as tokens are read: time to first token,
the gap between consecutive tokens, and arrival to finish. Gauges: requests running (prefilling
or decoding) and waiting, and the KV bytes the unfinished requests hold (their positions times
the model's KV bytes per token). With a prefix cache: its queries and hits, in tokens.

What a long run watches for leaks (``mlxlab bench soak``): requests admitted (a counter) and in
flight (submitted, not finished), MLX's active, cache and peak memory (read when scraped), and the
process's own figures (``process_resident_memory_bytes``, ``process_open_fds``... from
prometheus-client's process collector, on Linux) with its OS threads (``mlxlab:process_threads``).
"""

from __future__ import annotations

import os
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """The metrics of one server (their own registry, so servers in one process stay apart)."""

    def __init__(self, engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        r, t = self.registry, ["tenant"]
        self.ttft = Histogram("mlxlab:time_to_first_token_seconds", "Arrival to first output token.", t,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("mlxlab:inter_token_latency_seconds", "Gap between consecutive output tokens.", t,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("mlxlab:e2e_request_latency_seconds", "Arrival to finish.", t,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("mlxlab:prompt_tokens", "Prompt tokens of admitted requests.", t, registry=r)
        self.generation_tokens = Counter("mlxlab:generation_tokens", "Output tokens read.", t, registry=r)
        self.finished_requests = Counter("mlxlab:request_success", "Finished requests by reason.",
                                         t + ["finished_reason"], registry=r)
        self.running = Gauge("mlxlab:num_requests_running", "Requests prefilling or decoding.", registry=r)
        self.waiting = Gauge("mlxlab:num_requests_waiting", "Requests waiting for their first chunk.", registry=r)
        self.kv_bytes = Gauge("mlxlab:kv_cache_usage_bytes", "KV bytes held by unfinished requests.", registry=r)
        self.admitted = Counter("mlxlab:requests_admitted", "Requests the engine took (each finishes once).",
                                registry=r)
        self.in_flight = Gauge("mlxlab:num_requests_in_flight", "Requests submitted and not finished.", registry=r)
        memory = getattr(engine, "memory", None)
        if callable(memory):  # MLX's allocator, read when scraped (a counter read: safe beside the engine thread)
            for key, what in (("active", "held by live arrays"), ("cache", "freed, kept by the allocator for reuse"),
                              ("peak", "the most active at once since the process started")):
                Gauge(f"mlxlab:memory_{key}_bytes", f"MLX memory {what}.", registry=r).set_function(
                    lambda key=key: memory()[f"{key}_bytes"])
        Gauge("mlxlab:process_threads", "OS threads of the server process.", registry=r).set_function(_threads)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ... (Linux /proc)
        self.prefix_queries = Counter("mlxlab:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      registry=r)
        self.prefix_hits = Counter("mlxlab:prefix_cache_hits", "Prompt tokens restored from the prefix cache.",
                                   registry=r)

    def started(self, req) -> None:
        self.admitted.inc()
        self.prompt_tokens.labels(req.tenant).inc(len(req.prompt))
        if self.engine.prefix_cache is not None:
            self.prefix_queries.inc(len(req.prompt))
            self.prefix_hits.inc(req.cached_tokens)

    def tokens(self, req, already: int) -> None:
        """Observe ``req``'s tokens from index ``already`` on."""
        times = req.token_times_s
        if already == 0 and times:
            self.ttft.labels(req.tenant).observe(times[0] - req.arrival_s)
        for a, b in zip(times[max(already - 1, 0):], times[max(already, 1):]):
            self.itl.labels(req.tenant).observe(b - a)
        self.generation_tokens.labels(req.tenant).inc(len(times) - already)

    def finished(self, req) -> None:
        if req.e2e_s is not None:
            self.e2e.labels(req.tenant).observe(req.e2e_s)
        self.finished_requests.labels(req.tenant, req.finish_reason or "unknown").inc()

    def queues(self, live: int) -> None:
        """Set the gauges; ``live``: the requests submitted and not finished."""
        eng = self.engine
        waiting = sum(1 for s in eng._queue if s.req.prefill_start_s is None and not s.req.done)
        self.waiting.set(waiting)
        self.in_flight.set(live)
        self.running.set(live - waiting)
        self.kv_bytes.set(eng.kv_tokens_in_use() * eng.kv_bytes_per_token)


def _threads() -> int:
    """The process's OS threads (Linux: /proc/self/task), else the Python threads."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()
