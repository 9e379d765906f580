"""What the router tells about itself: Prometheus metrics, cache and pool figures, live latency
windows, the observer flows report to."""
