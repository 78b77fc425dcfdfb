"""From the source to user code: the dispatcher starts one pump per claim won; the pump
receives, runs the handler, redelivers and handles poison events; the watchdog ends
leases on time and watches handlers and the event loop."""
