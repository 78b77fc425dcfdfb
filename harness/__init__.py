"""The scenario harness the project's tests and benchmarks share; not packaged.

Consumer processes that report every delivered batch (:mod:`harness.worker`, run as
``python -m harness.worker``, and :mod:`harness.worker.process`, the parent's side), a
group of them on one hub and the planned-move and stateful scenarios they run
(:mod:`harness.group`, :mod:`harness.move_scenarios`, :mod:`harness.state_scenarios`),
the load scenario and its cgroup CPU quotas (:mod:`harness.load_scenario`,
:mod:`harness.cpu_quota`), store faults on Azurite and source faults on the Event Hubs
emulator (:mod:`harness.azurite_faults`, :mod:`harness.source_faults`), the files
each micro-batch of a Spark file sink wrote (:mod:`harness.spark_files`), the
convergence simulator that runs this SDK's processor beside azure-eventhub's on virtual
time (:mod:`harness.simulation`), a stand-in for the client azure-eventhub's processor
needs (:mod:`harness.standin_client`), an HTTP transport that counts requests
(:mod:`harness.counting_transport`), and the PostgreSQL sink's processes and fault
scenarios, counted from the table they wrote (:mod:`harness.postgres_worker`,
:mod:`harness.postgres_processes`, :mod:`harness.postgres_scenarios`; their long run is
``python -m harness.postgres_soak``).

The SDK's public testing tools (virtual time, fault-injecting store and source, the
delivery recorder, the ownership ledger) are :mod:`eventprocessor.testing`, which this
harness builds on. Run from the repository root, where ``harness`` is importable.
"""
