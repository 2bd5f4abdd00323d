//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/gymmetrics"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/metrics"
	"github.com/gymtrace/gymtrace/internal/pressure"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// startGymMetrics makes the recorder of Gym's metrics when something shows
// them: the OTLP exporter (metrics go where traces go), the Prometheus
// endpoint m, or the terminal's status line. Without one of them nothing is
// measured.
func (t *agent) startGymMetrics(ctx context.Context, m *metrics.Metrics) error {
	cfg := t.cfg
	otlp := cfg.Exporter == config.ExporterOTLP
	if !cfg.GymMetrics || !otlp && m == nil && t.status == nil {
		return nil
	}
	gc := gymmetrics.Config{
		Prometheus: m != nil,
		Semconv:    gymmetrics.SemconvFromEnv(os.Getenv("OTEL_SEMCONV_STABILITY_OPT_IN")),
		Resources:  export.NewResources(""),
		Reward:     cfg.Reward,
		Servers:    t.gymServers,
		Active:     t.gymActive,
		Pressure:   cfg.PressureInterval > 0,
		Log:        t.log.With("component", "gym-metrics"),
	}
	if otlp {
		exp, err := export.NewOTLPMetrics(ctx, export.OTLPConfig{
			Endpoint: cfg.OTLPEndpoint,
			Insecure: cfg.OTLPInsecure,
			Headers:  cfg.OTLPHeaders,
			Timeout:  cfg.OTLPTimeout,
		})
		if err != nil {
			return fmt.Errorf("setting up the OTLP metric exporter: %w", err)
		}
		gc.Exporter = exp
	}
	t.gym = gymmetrics.New(gc)
	if m != nil {
		m.AddGatherer(t.gym)
	}
	t.log.Debug("gym metrics on", "otlp", otlp, "prometheus", m != nil, "semconv", gc.Semconv.String())
	return nil
}

// observe measures spans for Gym's metrics, then keeps the sampled ones for
// export (the builder returns unsampled spans too when metrics are on).
func (t *agent) observe(s []spans.Span) []spans.Span {
	if t.gym != nil {
		t.gym.Observe(s)
	}
	out := s[:0]
	for _, sp := range s {
		if sp.Sampled {
			out = append(out, sp)
		}
	}
	return out
}

// gymServers counts the Gym servers orchestrator pid started that are
// traced now: its children, or their children (through a shell), ... The
// uvicorn workers of a server are the server, not more servers.
func (t *agent) gymServers(pid int) int {
	var servers []*discover.Process
	t.mu.RLock()
	for _, p := range t.procs {
		switch p.Role {
		case loader.RoleAgent, loader.RoleModel, loader.RoleResources:
			if !p.Worker {
				servers = append(servers, p)
			}
		}
	}
	t.mu.RUnlock()
	// /proc is read unlocked: a target being added must not wait for it.
	n := 0
	for _, p := range servers {
		if discover.Default.DescendsFrom(p, pid) {
			n++
		}
	}
	return n
}

// gymActive lists the inbound requests in flight, for
// http.server.active_requests.
func (t *agent) gymActive(yield func(gymmetrics.Active)) {
	t.spans.Builder().ActiveServer(func(a spans.ActiveRequest) {
		yield(gymmetrics.Active{PID: a.PID, Method: a.Method, Scheme: a.Scheme, Addr: a.Local, Port: a.Port, Host: a.Host})
	})
}

// closeGymMetrics exports the last values.
func (t *agent) closeGymMetrics() {
	if t.gym == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := t.gym.Close(ctx); err != nil {
		t.log.Warn("gym metrics: the last export failed", "err", err)
	}
}

// pressureLoop samples the traced processes' and the host's pressure from
// /proc every --pressure-interval, for Gym's pressure gauges: one pass
// over /proc per sample, whatever the number of targets (internal/pressure).
func (t *agent) pressureLoop(ctx context.Context, every time.Duration) {
	s := pressure.New("")
	tick := time.NewTicker(every)
	defer tick.Stop()
	failing := false
	for {
		t.mu.RLock()
		procs := make([]*discover.Process, 0, len(t.procs))
		for _, p := range t.procs {
			procs = append(procs, p)
		}
		t.mu.RUnlock()
		targets := make([]pressure.Target, len(procs))
		for i, p := range procs {
			targets[i] = pressure.Target{PID: p.PID, StartTime: p.StartTime}
		}
		readings, host, err := s.Sample(targets)
		switch {
		case err != nil && !failing:
			t.log.Warn("gym metrics: cannot sample process and host pressure from /proc; the gym.process.*, gym.process_tree.* and gym.host.* gauges are missing until it can",
				"err", err)
			failing = true
		case err == nil:
			if failing {
				t.log.Info("gym metrics: process and host pressure sampled again")
			}
			failing = false
			pp := make([]gymmetrics.ProcPressure, 0, len(readings))
			for i, p := range procs {
				if r, ok := readings[targets[i]]; ok {
					pp = append(pp, gymmetrics.ProcPressure{Proc: p, Reading: r})
				}
			}
			t.gym.SetPressure(pp, host)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
