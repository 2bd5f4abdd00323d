//go:build linux

package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Every Gym route is in the kernel's table under its role and under role 0
// (not yet known), with the /ng-rollout prefix removed as the kernel looks
// paths up.
func TestRouteTable(t *testing.T) {
	tab := routeTable()
	for _, r := range groups.GymRoutes() {
		path, _ := groups.StripRolloutPrefix(r.Path)
		m := methodCode(r.Method)
		if m == loader.MethodUnknown {
			t.Errorf("%s %s: method has no kernel code", r.Method, r.Path)
		}
		for _, role := range []uint8{uint8(r.Role), loader.RoleUnknown} {
			if got := tab[loader.NewRouteKey(role, m, path)]; got&uint64(r.Groups) != uint64(r.Groups) {
				t.Errorf("%s %s role %d: groups %#x, want %#x included", r.Method, r.Path, role, got, uint64(r.Groups))
			}
		}
	}
}

func TestGateFlags(t *testing.T) {
	t.Setenv("GYMTRACE_BENCH_NO_GATE", "")
	cases := []struct {
		rolloutIDs, reward, gym bool
		exporter, metricsAddr   string
		want                    uint32
	}{
		{false, false, false, "tree", "", 0},
		{true, false, false, "tree", "", loader.CfgRolloutIDs},
		{false, true, false, "tree", "", loader.CfgReward},
		{true, true, false, "tree", "", loader.CfgRolloutIDs | loader.CfgReward},
		// Gym's metrics count unsampled requests where they are exported.
		{false, false, true, "tree", "", 0},
		{false, false, true, "otlp", "", loader.CfgKeepUnsampled},
		{false, false, true, "tree", ":9464", loader.CfgKeepUnsampled},
		{false, false, false, "otlp", ":9464", 0},
	}
	for _, c := range cases {
		cfg := &config.Config{RolloutIDs: c.rolloutIDs, Reward: c.reward, GymMetrics: c.gym,
			Exporter: c.exporter, MetricsAddr: c.metricsAddr}
		if got := gateFlags(cfg); got != c.want {
			t.Errorf("gateFlags(%+v) = %#x, want %#x", c, got, c.want)
		}
	}
	if got := gateFlags(&config.Config{GenAI: true}); got != loader.CfgGenAI {
		t.Errorf("gateFlags(GenAI) = %#x, want CfgGenAI", got)
	}
	// The defaults read all three.
	cfg, err := (&config.Loader{LookupEnv: func(string) (string, bool) { return "", false }}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := gateFlags(cfg); got != loader.CfgRolloutIDs|loader.CfgReward|loader.CfgGenAI {
		t.Errorf("default gate flags %#x", got)
	}
}

// Every named kernel counter reads its own slot.
func TestKernelCounters(t *testing.T) {
	st := make([]uint64, loader.StatMax)
	for i := range st {
		st[i] = uint64(1000 + i)
	}
	got := kernelCounters(st)
	for name, slot := range map[string]uint32{"fresh_conns": loader.StatFresh, "reward_found": loader.StatRewardFound,
		"reward_missed": loader.StatRewardMissed, "not_http": loader.StatNotHTTP, "genai_read": loader.StatGenAIRead,
		"genai_absent": loader.StatGenAIAbsent, "genai_incomplete": loader.StatGenAIIncomplete} {
		if got[name] != uint64(1000+slot) {
			t.Errorf("%s = %d, want slot %d", name, got[name], slot)
		}
	}
	seen := map[uint64]string{}
	for name, v := range got {
		if other, ok := seen[v]; ok {
			t.Errorf("%s and %s read the same slot", name, other)
		}
		seen[v] = name
	}
}

func TestSampler(t *testing.T) {
	if sampler(1) != nil {
		t.Error("ratio 1 must sample everything without a sampler")
	}
	if sampler(0.25) == nil {
		t.Error("ratio 0.25 needs a sampler")
	}
}

// A --pid that names no process is the user's mistake: Run says so as a
// UsageError (exit status 2 in cmd/gymtrace) before attaching anything.
func TestRunRejectsMissingPID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: Run checks the kernel's features (preflight) before the pids")
	}
	cfg := &config.Config{PIDs: []config.PIDRole{{PID: 1 << 30}}, Mask: groups.DefaultMask}
	err := Run(context.Background(), cfg, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ue UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("Run with a missing pid: %v, want a UsageError", err)
	}
}
