"""Local stand-ins for the cloud services this SDK talks to, for tests, demos and samples.

* :mod:`eventprocessor.emulators.fault_proxy`: a loopback TCP proxy that injects network faults
  (latency, a black hole, resets, lost responses) between a client and a service.
* :mod:`eventprocessor.emulators.azurite`: starts and stops Azurite (the Azure Storage emulator, an npm
  package) on loopback, for the Blob and Table checkpoint stores.
* :mod:`eventprocessor.emulators.spark_cluster`: starts and stops a Spark standalone master, one worker
  and a Spark Connect server on loopback from the pip ``pyspark`` package, for the Spark
  sink's cluster tests, benchmark and sample (``python -m eventprocessor.emulators.spark_cluster``).

Nothing in the processor, the stores or the sources imports this sub-package.
"""
