"""The worker process: the gRPC servicer, its checks, wire conversions, registration and
heartbeats, role switches, KV events, the metrics endpoint."""
