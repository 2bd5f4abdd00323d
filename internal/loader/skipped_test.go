//go:build linux

package loader

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

type fakeProgStats struct {
	misses uint64
	err    error
}

func (f fakeProgStats) Stats() (*ebpf.ProgramStats, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &ebpf.ProgramStats{RecursionMisses: f.misses}, nil
}

// The runs the kernel skipped are summed over the programs; one whose stats
// cannot be read counts none.
func TestSkippedRuns(t *testing.T) {
	progs := map[string]fakeProgStats{"gt_exit_read": {misses: 14}, "gt_exit_recvfrom": {misses: 2},
		"gt_exit_write": {misses: 3}, "gt_exit_sendto": {}, "gt_exec": {err: errors.New("no info")}}
	if got := SkippedRuns(progs); got != 19 {
		t.Errorf("SkippedRuns = %d, want 19", got)
	}
	if got := SkippedRuns(map[string]fakeProgStats{}); got != 0 {
		t.Errorf("no programs: %d", got)
	}
	if got, want := strings.Join(SkippedRunsBy(progs), " "), "gt_exit_read=14 gt_exit_recvfrom=2 gt_exit_write=3"; got != want {
		t.Errorf("SkippedRunsBy = %q, want %q", got, want)
	}
}
