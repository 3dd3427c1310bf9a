"""Rollouts across processes and machines, on Ray: a run's `distributed` section (see
`selfplay.config.DistributedConfig`). Imported only when a run asks for rollout workers."""
