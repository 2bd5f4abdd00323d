package agent

import (
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
)

func TestTuneGCKeepsTheUsersSettings(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	tuneGC(log, func(string) (string, bool) { return "", false })
	if got := debug.SetGCPercent(100); got != agentGCPercent {
		t.Errorf("GC percent %d after tuneGC; want %d", got, agentGCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != agentMemoryLimit {
		t.Errorf("memory limit %d after tuneGC; want %d", got, agentMemoryLimit)
	}

	set := func(k string) (string, bool) { return "50", k == "GOGC" || k == "GOMEMLIMIT" }
	tuneGC(log, set)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent %d with GOGC set; want the user's (100 here)", got)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory limit %d with GOMEMLIMIT set; want the user's", got)
	}
}
