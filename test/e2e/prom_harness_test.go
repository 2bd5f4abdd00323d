//go:build linux

package e2e

// A real Prometheus (Debian's prometheus package) scraping one gymtrace,
// queried through its HTTP API, for the dashboard check (dashboard_test.go).

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

type promServer struct {
	*proc
	addr string
}

// needPrometheus finds Debian's prometheus binary. Outside CI a machine
// without it skips; in CI (CI=true) scripts/setup --tests installs it, so
// its absence is a failure.
func needPrometheus(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err == nil {
		return p
	}
	why := "needs Debian's prometheus package (scripts/setup --tests installs it, or apt-get install prometheus): no prometheus on PATH"
	if os.Getenv("CI") == "true" {
		t.Fatal(why + " (CI=true: the dashboard check must run in CI)")
	}
	t.Skip(why)
	return ""
}

// startPrometheus runs bin scraping target (host:port) every second, its
// data in a temporary directory, and waits until it is ready.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gymtrace
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &promServer{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	p.proc = startProc(t, t, "prometheus", []string{bin, "--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + p.addr, "--log.level=warn"}, procOpts{Dir: dir})
	c := &http.Client{Timeout: 2 * time.Second}
	waitFor(t, 60*time.Second, "prometheus to be ready", func() bool {
		if p.Exited() {
			t.Fatalf("prometheus exited: %v; stderr:\n%s", p.Err, tail(p.Stderr.String(), 4096))
		}
		resp, err := c.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// promSample is one series of an instant query's answer.
type promSample struct {
	Labels map[string]string
	Value  float64
}

// query evaluates expr at the instant at through /api/v1/query. A query
// Prometheus refuses is an error (a dashboard query that does not parse).
func (p *promServer) query(expr string, at time.Time) ([]promSample, error) {
	v := url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)}}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/api/v1/query?" + v.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("prometheus answered %s with no JSON: %w", resp.Status, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus refused %q: %s: %s", expr, body.ErrorType, body.Error)
	}
	switch body.Data.ResultType {
	case "vector":
		var vec []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(body.Data.Result, &vec); err != nil {
			return nil, err
		}
		out := make([]promSample, 0, len(vec))
		for _, s := range vec {
			out = append(out, promSample{Labels: s.Metric, Value: promValue(s.Value[1])})
		}
		return out, nil
	case "scalar":
		var sc [2]any
		if err := json.Unmarshal(body.Data.Result, &sc); err != nil {
			return nil, err
		}
		return []promSample{{Labels: map[string]string{}, Value: promValue(sc[1])}}, nil
	}
	return nil, fmt.Errorf("%q gave a %s, want a vector (an instant query)", expr, body.Data.ResultType)
}

func promValue(v any) float64 {
	s, ok := v.(string)
	if !ok {
		return math.NaN()
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}
