"""What the engine and the simulator share, with no MLX: requests and step records, plans,
workloads, the runner, metrics, the step-time cost model, results with provenance."""
