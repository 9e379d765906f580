"""The P:D ratio controller: its policy, settings, SLO window and lease, and the I/O that moves
workers between pools."""
