"""Who owns what: the taker's balancing tick and its claimer, the pure balancer (one
function per strategy) and load plan, the leases and the lease table, the ownership
writer, renewer and releaser, membership, liveness (one heartbeat keeps a processor's
partitions; when a tick may skip the ownership listing), the store's history and warm
replicas. Types
against a small pump protocol; never imports the delivery layer."""
