//go:build linux

package e2e

// The README's local UI, for real: gymtrace sends a run to Jaeger v2 over
// OTLP and the run is read back through Jaeger's query API (issue 41). The
// Jaeger is the API-only build of the Go module scripts/setup --tests makes
// (the README says why it has no UI; the API is the same code as the
// release's).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"
)

// jaegerBin is where scripts/setup --tests builds Jaeger (GYMTRACE_JAEGER
// overrides, as in setup).
func jaegerBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("GYMTRACE_JAEGER")
	if p == "" {
		p = "/var/tmp/gymtrace-jaeger/jaeger-v1.76.0"
	}
	if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
		return p
	}
	why := fmt.Sprintf("needs Jaeger at %s: scripts/setup --tests builds it (about 3.5 minutes, once)", p)
	if os.Getenv("CI") == "true" {
		t.Fatal(why + " (CI=true: the Jaeger check must run in CI)")
	}
	t.Skip(why)
	return ""
}

type jaegerServer struct {
	*proc
	query, otlp string // host:port of the query API and the OTLP/gRPC receiver
}

// startJaeger runs Jaeger all-in-one with in-memory storage on free ports
// (its defaults, 4317 and 16686, may be taken on a shared machine).
func startJaeger(t *testing.T, bin string) *jaegerServer {
	t.Helper()
	j := &jaegerServer{query: fmt.Sprintf("127.0.0.1:%d", freePort(t)), otlp: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	conf := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, j.query, freePort(t), j.otlp)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	j.proc = startProc(t, t, "jaeger", []string{bin, "--config", cfg}, procOpts{Dir: dir})
	waitFor(t, 60*time.Second, "jaeger's query API", func() bool {
		if j.Exited() {
			t.Fatalf("jaeger exited: %v; stderr:\n%s", j.Err, tail(j.Stderr.String(), 4096))
		}
		var s []string
		return j.get("/api/services", nil, &s) == nil
	})
	return j
}

// get decodes the "data" of a query API answer into out.
func (j *jaegerServer) get(path string, q url.Values, out any) error {
	u := "http://" + j.query + path
	if q != nil {
		u += "?" + q.Encode()
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var body struct {
		Data   json.RawMessage `json:"data"`
		Errors []any           `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if len(body.Errors) > 0 {
		return fmt.Errorf("GET %s: errors %v", u, body.Errors)
	}
	return json.Unmarshal(body.Data, out)
}

type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// traces returns every trace with a span of service, by trace id.
func (j *jaegerServer) traces(service string) (map[string]jaegerTrace, error) {
	var ts []jaegerTrace
	q := url.Values{"service": {service}, "limit": {"10000"}, "lookback": {"1h"}}
	if err := j.get("/api/traces", q, &ts); err != nil {
		return nil, err
	}
	out := map[string]jaegerTrace{}
	for _, tr := range ts {
		out[tr.TraceID] = tr
	}
	return out, nil
}

var spansExported = regexp.MustCompile(`gymtrace: detached.* spans_exported=(\d+)`)

func TestJaeger(t *testing.T) {
	needRoot(t)
	needStack(t)
	bin := jaegerBin(t)
	j := startJaeger(t, bin)
	st := sharedStack(t)
	const n, conc = 8, 4
	// What one rollout exports, by service and span name (rolloutCalls:
	// per_rollout has every group those calls need).
	svc := map[string]string{}
	for _, role := range []string{"agent", "model", "resources"} {
		svc[role] = "nemo-gym/" + st.server(role).Name
	}
	want := map[string]int{}
	for _, c := range rolloutCalls {
		want[svc[c.role]+" "+c.name] += c.n
		if c.gym != "" {
			want[svc[c.role]+" "+c.gym] += c.n
		}
	}
	perRollout := 0
	for _, k := range want {
		perRollout += k
	}

	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: "per_rollout", otlp: "http://" + j.otlp})
	st.collect(t, n, conc, true)
	gt.settle(t, n*perRollout)
	gt.shutdown(t)
	m := spansExported.FindStringSubmatch(gt.Stderr.String())
	if m == nil {
		t.Fatalf("gymtrace's last line names no spans_exported; stderr:\n%s", tail(gt.Stderr.String(), 4096))
	}
	exported, _ := strconv.Atoi(m[1])

	// Jaeger has every exported span: the traces of the three services.
	all := map[string]jaegerTrace{}
	var total int
	waitFor(t, 30*time.Second, fmt.Sprintf("jaeger to hold the %d spans gymtrace exported", exported), func() bool {
		clear(all)
		for _, s := range svc {
			ts, err := j.traces(s)
			if err != nil {
				t.Logf("querying jaeger: %v", err)
				return false
			}
			for id, tr := range ts {
				all[id] = tr
			}
		}
		total = 0
		for _, tr := range all {
			total += len(tr.Spans)
		}
		return total >= exported
	})
	var services []string
	if err := j.get("/api/services", nil, &services); err != nil {
		t.Fatal(err)
	}
	sort.Strings(services)
	for _, s := range svc {
		if !contains(services, s) {
			t.Errorf("jaeger's services %v lack %s", services, s)
		}
	}
	if total != exported || len(all) != n || exported != n*perRollout {
		t.Errorf("jaeger holds %d traces of %d spans; gymtrace exported %d spans; want %d traces of %d spans (one per rollout)",
			len(all), total, exported, n, n*perRollout)
	}

	// Each trace is one rollout: one gym.rollout, the calls of one rollout
	// in the right services, one root (POST /run) and every other span's
	// parent in the same trace.
	for id, tr := range all {
		got := map[string]int{}
		ids := map[string]bool{}
		for _, s := range tr.Spans {
			got[tr.Processes[s.ProcessID].ServiceName+" "+s.OperationName]++
			ids[s.SpanID] = true
		}
		var roots []string
		for _, s := range tr.Spans {
			parent := ""
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" {
					parent = r.SpanID
				}
			}
			switch {
			case parent == "":
				roots = append(roots, s.OperationName)
			case !ids[parent]:
				t.Errorf("trace %s: %s's parent %s is not in the trace", id, s.OperationName, parent)
			}
		}
		if len(roots) != 1 || roots[0] != "POST /run" {
			t.Errorf("trace %s: roots %v, want one POST /run", id, roots)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("trace %s: services and span names\n got %v\nwant %v", id, got, want)
		}
	}
	t.Logf("jaeger: %d traces, %d spans (gymtrace exported %d), services %v", len(all), total, exported, services)
}
