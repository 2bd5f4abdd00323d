//go:build linux

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCausalityKept scores a collection traced elsewhere (scripts/slow-machine:
// inside a QEMU guest): GYMTRACE_SCORE_DIR holds spans.jsonl, truth.jsonl,
// since (CLOCK_MONOTONIC ns when the collection started) and pids (the traced
// servers, comma-separated). It reports; it asserts nothing.
//
//	GYMTRACE_SCORE_DIR=/var/tmp/gymtrace-slow/out-asyncio/asyncio go test ./test/e2e -run CausalityKept -v
func TestCausalityKept(t *testing.T) {
	dir := os.Getenv("GYMTRACE_SCORE_DIR")
	if dir == "" {
		t.Skip("GYMTRACE_SCORE_DIR not set")
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	since, err := strconv.ParseInt(read("since"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range strings.Split(read("pids"), ",") {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, n)
	}
	recs, err := readTruth(filepath.Join(dir, "truth.jsonl"), since)
	if err != nil {
		t.Fatal(err)
	}
	sc := scoreCausality(recs, readSpans(t, filepath.Join(dir, "spans.jsonl")), pids)
	t.Logf("outbound %d, client spans %d, correct %d, wrong %d, unattributed %d (%s); server spans %d/%d, stray %d; "+
		"rollouts %d, in one trace %d, whole %d, touched by a loss %d, untouched split %d; traces %d, shared %d; rollout ids wrong %d",
		sc.Outbound, sc.ClientSpans, sc.Correct, sc.Wrong, sc.Unattributed, sc.ReasonsString(), sc.ServerSpans, sc.Inbound, sc.StraySpans,
		sc.Rollouts, sc.RolloutsOneTrace, sc.RolloutsWhole, sc.RolloutsTouched, sc.RolloutsUntouchedSplit, sc.Traces, sc.SharedTraces, sc.RolloutIDWrong)
	if len(sc.Examples) > 0 {
		t.Logf("first findings:\n  %s", strings.Join(sc.Examples, "\n  "))
	}
	if len(sc.WrongExamples) > 0 {
		t.Logf("first wrong parents:\n  %s", strings.Join(sc.WrongExamples, "\n  "))
	}
}
