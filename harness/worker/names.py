"""Names the worker program and its parent agree on."""

HUB_ENV = "EVENTPROCESSOR_WORKER_HUB"
"""The environment variable that holds the hub's connection string."""
STORAGE_ENV = "EVENTPROCESSOR_WORKER_STORAGE"
"""The environment variable that holds the storage account's connection string."""
STANDIN_NAMESPACE = "scale.servicebus.windows.net"
"""The namespace a worker without a hub (``--source none``) names in its ownership records."""
