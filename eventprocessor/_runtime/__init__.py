"""What every part of the processor runs on: the clock and every wait on it, the task
scope, backoff, the options and the timing model, reporting, telemetry, the counters and
the bounded store calls. Imports nothing of the processor above it."""
