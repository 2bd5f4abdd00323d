package gymmetrics

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/pressure"
	"github.com/gymtrace/gymtrace/internal/spans"
)

func gauge(t *testing.T, m metricdata.Metrics) float64 {
	t.Helper()
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Attributes.Len() != 0 {
		t.Fatalf("%s: want one float gauge point without attributes, got %#v", m.Name, m.Data)
	}
	return g.DataPoints[0].Value
}

// TestPressureGauges: Gym's five gauges, on each process's resource, with
// the sample's values and Gym's units; the host's on every process.
func TestPressureGauges(t *testing.T) {
	r, exp := newTest(t, Config{Pressure: true})
	host := pressure.Host{UsedMiB: 3000.5, TotalMiB: 8000}
	r.SetPressure([]ProcPressure{
		{agentProc, pressure.Reading{CPU: 150, HasCPU: true, TreeCPU: 175.5, HasTreeCPU: true, TreeMiB: 42.25}},
		{resProc, pressure.Reading{TreeMiB: 7}}, // a first sample: no interval, no CPU
	}, host)
	got := flush(t, r, exp)
	agent, res := got["nemo-gym/simple_agent"], got["nemo-gym/simple_weather"]
	if agent == nil || res == nil {
		t.Fatalf("want both processes' metrics without any span, got %v", keys(got))
	}
	for name, want := range map[string]float64{ProcessCPU: 150, ProcessTreeCPU: 175.5, ProcessTreeMem: 42.25,
		HostMemoryUsed: 3000.5, HostMemoryTotal: 8000} {
		if v := gauge(t, agent[name]); v != want {
			t.Errorf("agent %s = %v, want %v", name, v, want)
		}
	}
	for name, unit := range map[string]string{ProcessCPU: "%", ProcessTreeCPU: "%", ProcessTreeMem: "MiB",
		HostMemoryUsed: "MiB", HostMemoryTotal: "MiB"} {
		if agent[name].Unit != unit {
			t.Errorf("%s unit %q, want Gym's %q", name, agent[name].Unit, unit)
		}
	}
	if _, ok := res[ProcessCPU]; ok {
		t.Errorf("a process's first sample reported CPU: %#v", res[ProcessCPU])
	}
	if v := gauge(t, res[ProcessTreeMem]); v != 7 {
		t.Errorf("resources tree memory %v, want 7", v)
	}
	if v := gauge(t, res[HostMemoryTotal]); v != 8000 {
		t.Errorf("resources host total %v, want the host's 8000 on every process", v)
	}

	fams, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	// The Prometheus names the dashboard (deploy/grafana) queries: the
	// OTel-to-Prometheus translation keeps Gym's non-UCUM unit "MiB" as a
	// suffix, as a collector's Prometheus exporter would for Gym's own.
	for _, n := range []string{"gym_process_cpu_percent", "gym_process_tree_cpu_percent",
		"gym_process_tree_memory_used_mib_MiB", "gym_host_memory_used_mib_MiB", "gym_host_memory_total_mib_MiB"} {
		if byName[n] == nil {
			t.Errorf("no %s in %v", n, keys(byName))
		}
	}
}

// TestPressureOff: without Config.Pressure no process has the gauges.
func TestPressureOff(t *testing.T) {
	r, exp := newTest(t, Config{})
	r.SetPressure([]ProcPressure{{agentProc, pressure.Reading{CPU: 1, HasCPU: true, TreeMiB: 1}}}, pressure.Host{UsedMiB: 1, TotalMiB: 2})
	for _, byName := range flush(t, r, exp) {
		if _, ok := byName[ProcessCPU]; ok {
			t.Fatal("pressure gauges with pressure off")
		}
	}
}

// TestPressureKeepsSpanIdentity: a process whose spans name it by the role
// its traffic showed keeps one provider; samples (which carry discovery's
// record, role unknown) do not replace it back and forth.
func TestPressureKeepsSpanIdentity(t *testing.T) {
	r, exp := newTest(t, Config{Pressure: true})
	disc := &discover.Process{PID: 400, StartTime: 9}
	inferred := *disc
	inferred.Role, inferred.ServerName = discover.RoleAgent, "my_agent"
	rd := pressure.Reading{CPU: 5, HasCPU: true, TreeCPU: 5, HasTreeCPU: true, TreeMiB: 3}
	r.SetPressure([]ProcPressure{{disc, rd}}, pressure.Host{UsedMiB: 1, TotalMiB: 2})
	r.Observe([]spans.Span{span("gym.rollout", trace.SpanKindInternal, "rollout", &inferred, time.Second)})
	r.Tick(time.Now()) // the first provider's last export
	rd.CPU = 6
	r.SetPressure([]ProcPressure{{disc, rd}}, pressure.Host{UsedMiB: 1, TotalMiB: 2})
	r.mu.Lock()
	n, retired := len(r.procs), len(r.retired)
	r.mu.Unlock()
	if n != 1 || retired != 0 {
		t.Fatalf("%d providers and %d retired after a sample: the sample replaced the span's provider", n, retired)
	}
	got := flush(t, r, exp)["nemo-gym/my_agent"]
	if got == nil || gauge(t, got[ProcessCPU]) != 6 {
		t.Fatalf("the span identity's provider does not report the sample: %v", got)
	}
}

// TestPressureGone: an exited process reports no pressure.
func TestPressureGone(t *testing.T) {
	r, exp := newTest(t, Config{Pressure: true})
	r.SetPressure([]ProcPressure{{agentProc, pressure.Reading{CPU: 1, HasCPU: true, TreeMiB: 1}}}, pressure.Host{UsedMiB: 1, TotalMiB: 2})
	r.Gone(agentProc.PID)
	exp.mu.Lock()
	exp.got = nil
	exp.mu.Unlock()
	for svc, byName := range flush(t, r, exp) {
		for _, n := range []string{ProcessCPU, ProcessTreeMem, HostMemoryUsed} {
			if _, ok := byName[n]; ok {
				t.Errorf("%s of exited %s still reported", n, svc)
			}
		}
	}
}
