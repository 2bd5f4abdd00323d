package gymmetrics

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// Bucket boundaries. The duration histograms keep the SDK's defaults, as
// Gym's do (0 … 10000 ms); the stable HTTP ones take the instrumentation's
// advisory boundaries in seconds. Rewards are mostly in [0, 1] (or [-1, 1]):
// tenths there, coarser outside; sum and count are exact either way.
var (
	secondsBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	rewardBuckets  = []float64{-10, -5, -2, -1, -0.5, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2, 5, 10}
)

// promLabels are the resource attributes every Prometheus series carries,
// so the processes' series (one registry each) never collide when gathered
// together; target_info has the whole resource.
var promLabels = attribute.NewAllowKeysFilter("service.name", "process.pid")

// proc is one traced process's metrics.
type proc struct {
	p   discover.Process
	mp  *sdkmetric.MeterProvider
	reg *prometheus.Registry // nil without Prometheus
	m   metric.Meter

	rollout, verify, reward metric.Float64Histogram
	success                 metric.Float64Gauge
	srvDur, cliDur          [2]metric.Float64Histogram // [old, new]; nil when that convention is off
	srvReq, srvResp         [2]metric.Int64Histogram
	verifyOK, verifyAll     uint64
	gi                      genaiInst   // model, tool, rollout and turn instruments (genai.go)
	st                      startupInst // server startup (startup.go)

	series map[string]map[attribute.Distinct]struct{} // under Recorder.mu
	// sets: the attribute set each HTTP measurement's inputs gave, so a
	// repeated exchange (the common case: a few routes, one status) builds
	// and hashes none (measured: most of the agent's metrics CPU). Under
	// Recorder.mu; bounded by maxSetCache.
	sets map[setKey]attribute.Set

	// The SDK runs the callbacks under its own lock while it collects, and
	// Recorder.mu is held while instruments are made and recorded into: a
	// callback takes neither, only what follows.
	amu        sync.Mutex
	activeSeen map[attribute.Distinct]attribute.Set // every active_requests set observed: reported at 0 when idle
	gone       atomic.Int64                         // when the process exited (unix ns); 0 while it runs
}

func (pr *proc) goneAt() time.Time {
	if ns := pr.gone.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// newProc makes p's provider and instruments; an orchestrator's gets its
// gym.servers.active gauge (whether discovery or its traffic said so).
func newProc(r *Recorder, p discover.Process) *proc {
	pr := &proc{p: p, series: map[string]map[attribute.Distinct]struct{}{}, sets: map[setKey]attribute.Set{},
		activeSeen: map[attribute.Distinct]attribute.Set{}}
	opts := []sdkmetric.Option{sdkmetric.WithResource(r.cfg.Resources.For(&p))}
	if r.exp != nil {
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(r.exp)))
	}
	if r.cfg.Prometheus {
		pr.reg = prometheus.NewRegistry()
		pe, err := otelprom.New(otelprom.WithRegisterer(pr.reg), otelprom.WithResourceAsConstantLabels(promLabels))
		if err != nil {
			r.cfg.Log.Warn("gym metrics: no Prometheus reader for this process", "pid", p.PID, "err", err)
			pr.reg = nil
		} else {
			opts = append(opts, sdkmetric.WithReader(pe))
		}
	}
	pr.mp = sdkmetric.NewMeterProvider(opts...)
	pr.m = pr.mp.Meter(export.ScopeName)
	m := pr.m
	// The API's instruments do not fail for these names and options; an
	// error would leave a no-op instrument, which is what a nil check buys.
	pr.rollout, _ = m.Float64Histogram(RolloutDuration, metric.WithUnit("ms"),
		metric.WithDescription("Duration of one rollout (agent /run)"))
	pr.verify, _ = m.Float64Histogram(VerifyDuration, metric.WithUnit("ms"),
		metric.WithDescription("Duration of one /verify call"))
	pr.success, _ = m.Float64Gauge(VerifySuccess, metric.WithUnit("1"),
		metric.WithDescription("Fraction of /verify calls that succeeded, since the process started"))
	pr.reward, _ = m.Float64Histogram(VerifyReward, metric.WithUnit("1"),
		metric.WithDescription("Reward returned by /verify (read by gymtrace from the response)"),
		metric.WithExplicitBucketBoundaries(rewardBuckets...))
	pr.gi = newGenAIInst(m)
	pr.st = newStartupInst(m)
	if r.cfg.Semconv&SemconvOld != 0 {
		pr.srvDur[0], _ = m.Float64Histogram(ServerDurationOld, metric.WithUnit("ms"),
			metric.WithDescription("Measures the duration of inbound HTTP requests."))
		pr.srvReq[0], _ = m.Int64Histogram(ServerReqSizeOld, metric.WithUnit("By"),
			metric.WithDescription("Measures the size of HTTP request messages (compressed)."))
		pr.srvResp[0], _ = m.Int64Histogram(ServerRespSizeOld, metric.WithUnit("By"),
			metric.WithDescription("measures the size of HTTP response messages (compressed)."))
		pr.cliDur[0], _ = m.Float64Histogram(ClientDurationOld, metric.WithUnit("ms"),
			metric.WithDescription("measures the duration of the outbound HTTP request"))
	}
	if r.cfg.Semconv&SemconvNew != 0 {
		pr.srvDur[1], _ = m.Float64Histogram(ServerDurationNew, metric.WithUnit("s"),
			metric.WithDescription("Duration of HTTP server requests."),
			metric.WithExplicitBucketBoundaries(secondsBuckets...))
		pr.srvReq[1], _ = m.Int64Histogram(ServerReqSizeNew, metric.WithUnit("By"),
			metric.WithDescription("Size of HTTP server request bodies."))
		pr.srvResp[1], _ = m.Int64Histogram(ServerRespSizeNew, metric.WithUnit("By"),
			metric.WithDescription("Size of HTTP server response bodies."))
		pr.cliDur[1], _ = m.Float64Histogram(ClientDurationNew, metric.WithUnit("s"),
			metric.WithDescription("Duration of HTTP client requests."),
			metric.WithExplicitBucketBoundaries(secondsBuckets...))
	}
	if r.cfg.Active != nil {
		active, err := m.Int64ObservableUpDownCounter(ServerActive, metric.WithUnit("{request}"),
			metric.WithDescription("Number of active HTTP server requests."))
		if err == nil {
			_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
				r.observeActive(pr, active, o)
				return nil
			}, active)
		}
	}
	if r.cfg.Pressure {
		pr.pressureGauges(r)
	}
	if p.Role == discover.RoleOrchestrator && r.cfg.Servers != nil {
		pr.serversGauge(r.cfg.Servers)
	}
	return pr
}

// serversGauge is an orchestrator's gym.servers.active: the servers it
// started that run now, 0 once it exited.
func (pr *proc) serversGauge(servers func(pid int) int) {
	g, err := pr.m.Int64ObservableGauge(ServersActive, metric.WithUnit("{server}"),
		metric.WithDescription("Number of Gym servers this orchestrator runs"))
	if err != nil {
		return
	}
	pid := pr.p.PID
	_, _ = pr.m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n := 0
		if pr.gone.Load() == 0 {
			n = servers(pid)
		}
		o.ObserveInt64(g, int64(n))
		return nil
	}, g)
}

// observeActive reports pr's requests in flight by attribute set, and 0
// for every set seen before, as the instrumentation's up-down counter does.
func (r *Recorder) observeActive(pr *proc, inst metric.Int64ObservableUpDownCounter, o metric.Observer) {
	counts := map[attribute.Distinct]int64{}
	pr.amu.Lock()
	for _, a := range r.activeNow() {
		if int(a.PID) != pr.p.PID {
			continue
		}
		set := attribute.NewSet(activeAttrs(&a, r.cfg.Semconv)...)
		if _, ok := pr.activeSeen[set.Equivalent()]; !ok && len(pr.activeSeen) < r.cfg.MaxSeries {
			pr.activeSeen[set.Equivalent()] = set
		}
		counts[set.Equivalent()]++
	}
	seen := make([]attribute.Set, 0, len(pr.activeSeen))
	for _, set := range pr.activeSeen {
		seen = append(seen, set)
	}
	pr.amu.Unlock()
	for _, set := range seen {
		o.ObserveInt64(inst, counts[set.Equivalent()], metric.WithAttributeSet(set))
	}
}

func (pr *proc) close(ctx context.Context, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pr.mp.Shutdown(ctx); err != nil {
		log.Debug("gym metrics: closing a process's metrics", "pid", pr.p.PID, "err", err)
	}
}

// What a span is measured as.
type kind uint8

const (
	kindNone kind = iota
	kindServer
	kindClient
	kindRollout
	kindVerify
	kindModel
	kindStartupServer
	kindStartupStage
)

func measureKind(s *spans.Span) kind {
	switch {
	case s.Kind == trace.SpanKindServer && s.Group == "server":
		return kindServer
	case s.Kind == trace.SpanKindClient && s.Group == "http_client":
		return kindClient
	case s.Name == "gym.rollout":
		return kindRollout
	case s.Name == "gym.verify":
		return kindVerify
	case strings.HasPrefix(s.Name, "gym.model."):
		return kindModel
	case isStartupServer(s):
		return kindStartupServer
	case isStartupStage(s):
		return kindStartupStage
	}
	return kindNone
}

// measure records one span (r.mu held).
func (r *Recorder) measure(pr *proc, s *spans.Span, k kind) {
	ctx := context.Background()
	d := s.End.Sub(s.Start)
	if d < 0 {
		d = 0
	}
	// Gym's instruments carry no attributes.
	noAttrs := metric.WithAttributeSet(attribute.NewSet())
	switch k {
	case kindRollout:
		pr.rollout.Record(ctx, ms(d), noAttrs)
		r.sum.rollout(s.End, d)
		r.measureRollout(pr, s)
	case kindModel:
		r.measureModel(pr, s)
	case kindStartupServer, kindStartupStage:
		r.measureStartup(pr, s, k == kindStartupStage)
	case kindVerify:
		pr.verify.Record(ctx, ms(d), noAttrs)
		pr.verifyAll++
		ok := s.Status != codes.Error
		if ok {
			pr.verifyOK++
		}
		pr.success.Record(ctx, float64(pr.verifyOK)/float64(pr.verifyAll), noAttrs)
		r.sum.verify(ok)
		switch {
		case s.Measures.HasReward:
			pr.reward.Record(ctx, s.Measures.Reward, noAttrs)
		case r.reward.Load() && s.Measures.Status/100 == 2:
			// The kernel scans 2xx answers only: an error carries no reward.
			r.rewardMissing.Add(1)
		}
	case kindServer, kindClient:
		e := fromSpan(s)
		for i, sc := range [2]Semconv{SemconvOld, SemconvNew} {
			v := d.Seconds()
			if sc == SemconvOld {
				v = math.RoundToEven(ms(d)) // whole milliseconds, as Python's round()
			}
			if k == kindClient {
				if pr.cliDur[i] != nil {
					set := r.cachedSet(pr, setKey{e, sc, true})
					pr.cliDur[i].Record(ctx, v, metric.WithAttributeSet(set))
				}
				continue
			}
			if pr.srvDur[i] == nil {
				continue
			}
			set := metric.WithAttributeSet(r.cachedSet(pr, setKey{e, sc, false}))
			pr.srvDur[i].Record(ctx, v, set)
			pr.srvReq[i].Record(ctx, int64(s.Measures.ReqBody), set)
			pr.srvResp[i].Record(ctx, int64(s.Measures.RespBody), set)
		}
		if k == kindServer {
			r.measureTool(pr, s, &e)
		}
	}
}

// setKey is what an HTTP measurement's attribute set depends on.
type setKey struct {
	e      exchange
	sc     Semconv
	client bool
}

// maxSetCache bounds proc.sets; past it sets are built each time (still
// capped as series by attrSet).
const maxSetCache = 1024

// cachedSet is attrSet for the duration and size histograms of k, built
// once per distinct k.
func (r *Recorder) cachedSet(pr *proc, k setKey) attribute.Set {
	if set, ok := pr.sets[k]; ok {
		return set
	}
	var set attribute.Set
	if k.client {
		set = r.attrSet(pr, k.sc.String()+"/client", clientDurationAttrs(&k.e, k.sc))
	} else {
		set = r.attrSet(pr, k.sc.String()+"/server", serverDurationAttrs(&k.e, k.sc))
	}
	if len(pr.sets) < maxSetCache {
		pr.sets[k] = set
	}
	return set
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fromSpan reads the HTTP metrics' inputs from a SERVER or CLIENT span's
// attributes.
func fromSpan(s *spans.Span) exchange {
	e := exchange{host: s.Measures.Host}
	for _, kv := range s.Attrs {
		switch kv.Key {
		case "http.request.method":
			e.method = kv.Value.AsString()
		case "url.scheme":
			e.scheme = kv.Value.AsString()
		case "url.full":
			if e.scheme == "" {
				if v := kv.Value.AsString(); len(v) > 5 && v[:5] == "https" {
					e.scheme = "https"
				} else {
					e.scheme = "http"
				}
			}
		case "http.route":
			e.route = kv.Value.AsString()
		case "http.response.status_code":
			e.status = int(kv.Value.AsInt64())
		case "error.type":
			e.errType = kv.Value.AsString()
		case "server.address":
			e.addr = kv.Value.AsString()
		case "server.port":
			e.port = int(kv.Value.AsInt64())
		}
	}
	return e
}
