#!/usr/bin/env bash
# make fault: the fault scenarios' long schedules, then $SHOAL_FAULT_SCHEDULES
# (default 200) random schedules split over $SHOAL_FAULT_PROCS (default 2)
# concurrent processes. A schedule spends most of its time waiting on its
# cluster (faults last seconds, the load is paced), so two processes on the
# 2-core reference machine run 200 schedules in about half the time of one
# (~2 h instead of ~3.5 h, test/robustness/README.md "How to run").
#
# Every process uses the run's seed ($SHOAL_ROBUSTNESS_SEED, else the clock)
# and its own range of schedule numbers (SHOAL_FAULT_SCHEDULE_FIRST), so
# schedule i has seed + i whichever process ran it, and a failure prints the
# command that reruns it alone. Records go to $SHOAL_ROBUSTNESS_RESULTS when
# set (each is one appended line); logs to $SHOAL_FAULT_LOGS (default a
# temporary directory, printed). SHOAL_FAULT_RANDOM_ONLY=1 skips the fixed
# scenarios.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${SHOAL_FAULT_SCHEDULES:-200}
procs=${SHOAL_FAULT_PROCS:-2}
seed=${SHOAL_ROBUSTNESS_SEED:-$(date +%s%N)}
logs=${SHOAL_FAULT_LOGS:-$(mktemp -d -t shoal-fault-XXXXXX)}
mkdir -p "$logs"
rm -f "$logs/crashed"
export SHOAL_FAULT=long
if ! [[ $n =~ ^[0-9]+$ && $procs =~ ^[1-9][0-9]*$ ]]; then
	echo "fault.sh: SHOAL_FAULT_SCHEDULES must be a count and SHOAL_FAULT_PROCS a positive count (got '$n', '$procs')" >&2
	exit 2
fi
status=0
if [ "${SHOAL_FAULT_RANDOM_ONLY:-}" != 1 ]; then
	echo "fault: the fixed scenarios' long schedules (every Fault test but the random schedules)"
	go test -count=1 -timeout 120m -run Fault -skip '^TestFaultRandomSchedules$' ./test/... || status=1
fi
[ "$n" -gt 0 ] || exit $status
bin="$logs/robustness.test"
go test -c -o "$bin" ./test/robustness/
echo "fault: $n random schedules over $procs processes, seed $seed (schedule i: seed + i), logs in $logs"
# run_range FIRST END K runs schedules FIRST..END-1 in process K. A process
# that dies inside a schedule (a checker's memory guard panics by design, a
# runtime crash) takes no other schedule with it: the range goes on from
# the next schedule in a new process (log random-K.N.log), and the crash
# counts as a failure.
run_range() {
	local first=$1 end=$2 k=$3 attempt=0 log rc=0 last
	while [ "$first" -lt "$end" ]; do
		log="$logs/random-$k.log"
		[ "$attempt" -eq 0 ] || log="$logs/random-$k.$attempt.log"
		(cd test/robustness && SHOAL_ROBUSTNESS_SEED=$seed SHOAL_FAULT_SCHEDULE_FIRST=$first SHOAL_FAULT_SCHEDULES=$((end - first)) \
			"$bin" -test.count=1 -test.timeout=300m -test.run '^TestFaultRandomSchedules$' -test.v >"$log" 2>&1) || rc=1
		# A process that finished prints the parent test's verdict.
		if grep -qE '^--- (PASS|FAIL): TestFaultRandomSchedules ' "$log"; then
			break
		fi
		last=$(grep -oE '^=== RUN   TestFaultRandomSchedules/schedule-[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || true)
		if [ -z "$last" ]; then
			echo "fault: process $k died before its first schedule; see $log"
			break
		fi
		last=$((10#$last))
		echo "fault: process $k died in schedule $last (counted as failed; $(grep -m1 -E '^(panic|fatal error): ' "$log" | cut -c1-200)); going on from $((last + 1))"
		echo "$last" >>"$logs/crashed"
		first=$((last + 1))
		attempt=$((attempt + 1))
	done
	return $rc
}
pids=()
for ((k = 0; k < procs; k++)); do
	first=$((k * n / procs))
	count=$(((k + 1) * n / procs - first))
	[ "$count" -gt 0 ] || continue
	run_range "$first" $((first + count)) "$k" &
	pids+=($!)
	echo "fault: process $k: schedules $first–$((first + count - 1)), log $logs/random-$k.log"
done
for k in "${!pids[@]}"; do
	if ! wait "${pids[$k]}"; then
		status=1
		echo "fault: process $k failed; its failing schedules:"
		cat "$logs/random-$k.log" "$logs/random-$k".*.log 2>/dev/null | grep -E '^    --- FAIL|rerun: ' || tail -20 "$logs/random-$k.log"
	fi
done
passed=$(cat "$logs"/random-*.log | grep -cE '^    --- PASS: TestFaultRandomSchedules/' || true)
failed=$(cat "$logs"/random-*.log | grep -cE '^    --- FAIL: TestFaultRandomSchedules/' || true)
crashed=$(cat "$logs/crashed" 2>/dev/null | wc -l)
echo "fault: random schedules passed $passed, failed $failed, died in $crashed (of $n); logs in $logs"
exit $status
