"""One request's life across the workers: its plan, the reservation it waits for, the calls and
the stream, its samples; what a flow takes and gives."""
