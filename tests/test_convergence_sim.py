"""Keep the convergence simulator honest, as a program: ``python -m benchmarks.convergence
--self-check`` runs its checks (``benchmarks/simulation_checks.py``) on the virtual loop and
prints one line per check. Tests never import the benchmarks, so this test runs it and
requires every check below to have run and passed.

The checks: a simulated run of this SDK's real EventProcessor ends where the balancer
unit tests say it ends; the simulator's own machinery (instants on the virtual loop, tick
schedules, lockstep sequencing, request accounting, the official processor's harness)
produces known results for known schedules; the delivery measurements are real (a steal
of the official processor re-delivers the batch in flight and shows as overlap, this
SDK's handoffs show neither). The same behaviour of this SDK is tested directly, on
:class:`eventprocessor.testing.Cluster`, in ``tests/test_rebalance_scenarios.py``.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECKS = [
    "ours_5_partitions_1_then_6_processors_ends_with_one_idle",
    "ours_18_partitions_3_to_4_processors_ends_4_4_5_5_with_minimal_moves_by_handoff",
    "ours_20_partitions_4_to_3_after_crash_ends_6_7_7_without_steals",
    "ours_20_to_25_partitions_with_4_processors_ends_6_6_6_7",
    "ours_graceful_scale_in_releases_so_survivors_take_over_without_steals",
    "ours_greedy_cold_start_takes_one_tick_because_members_join_first",
    "ours_static_shares_by_ordinal_then_the_returning_ordinal_gets_its_share_back_by_handoff",
    "ours_balance_factor_leaves_a_small_imbalance_alone",
    "an_instant_runs_its_store_work_after_everything_else_in_the_order_it_was_sent",
    "a_cancelled_sleep_leaves_no_wake_up_behind",
    "lockstep_schedule_ticks_every_instance_at_the_same_instants",
    "staggered_schedule_waits_an_interval_after_each_tick_completes",
    "known_schedule_gives_known_tick_counts_for_the_official_balancer",
    "known_schedule_gives_known_tick_counts_for_ours",
    "lockstep_instances_list_the_same_snapshot_before_anyone_writes",
    "official_module_time_and_random_are_restored_after_a_run",
    "official_instance_sees_its_own_skewed_clock_but_records_carry_store_time",
    "official_dispatch_runs_one_receive_task_per_partition_its_last_claim_returned",
    "minimal_moves_and_one_per_tick_limits",
    "concurrent_write_batches_interleave_record_by_record",
    "steady_requests_per_hour_match_the_formulas_members_included",
    "equal_cost_candidates_are_the_shortest_expirations_within_the_budget",
    "both_sides_choose_from_the_same_candidates_each_within_its_own_cost",
    "deliveries_count_duplicates_overlap_and_pauses_from_batches",
    "an_official_steal_redelivers_the_batch_in_flight_and_both_claims_deliver_at_once",
    "ours_hands_over_instead_so_the_same_scale_out_has_no_duplicate_and_no_overlap",
    "a_crash_costs_exactly_the_batches_in_flight_and_the_dead_instance_sends_nothing",
    "rolling_restart_ours_hands_over_without_duplicates_the_official_stop_cancels_batches",
    "standbys_own_nothing_and_one_takes_over_once_the_crashed_records_expired",
    "events_of_partitions_the_official_never_claims_are_counted_as_never_delivered",
]


def test_the_simulator_passes_every_one_of_its_self_checks():
    out = subprocess.run([sys.executable, "-m", "benchmarks.convergence", "--self-check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    passed = [line[len("ok check_"):] for line in out.stdout.splitlines() if line.startswith("ok check_")]
    assert passed == CHECKS, "checks added, lost or reordered: update CHECKS with a reason"
    assert f"{len(CHECKS)} checks passed" in out.stdout


def test_self_check_runs_the_checks_named_and_takes_no_benchmark_flags():
    out = subprocess.run([sys.executable, "-m", "benchmarks.convergence", "--self-check", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--self-check runs no benchmark" in out.stderr
    one = subprocess.run([sys.executable, "-m", "benchmarks.convergence", "--self-check",
                          "check_minimal_moves_and_one_per_tick_limits"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert one.returncode == 0 and one.stdout.splitlines() == ["ok check_minimal_moves_and_one_per_tick_limits",
                                                               "1 checks passed"]
