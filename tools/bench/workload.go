//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// wlConfig is one way of running the Gym-shaped workload.
type wlConfig struct {
	Name    string // row name in the table
	Traced  bool
	Spec    string // --span-groups
	NoGate  bool   // GYMTRACE_BENCH_NO_GATE=1
	Runtime string // "" the host's 3.11, default loop, h11; runtimeGym; runtimeSid, runtimeSidAsyncio
	Args    []string
	// Baseline: the row runs the --baseline binary (an older gymtrace),
	// in the same rounds as the row it twins (rowConfigs).
	Baseline bool
	// GymTel: the servers run Gym's own in-process telemetry
	// (test/stack/gymtel.py) with this exporter, "otlp" (http/protobuf to
	// the bench's sink) or "noop" (export does nothing), and Gym's span
	// groups GymSpec. Such a row is not traced by gymtrace; it has a stack
	// of its own and compares with its runtime's untraced row.
	GymTel, GymSpec string
	// FullOnly rows are left out of --short runs.
	FullOnly bool
}

// compared: the row has ratios against its untraced row.
func (c wlConfig) compared() bool { return c.Traced || c.GymTel != "" }

// stackKey names the stack a row runs on: one per runtime, and one per Gym
// telemetry setup (the servers are started with it).
func (c wlConfig) stackKey() string {
	if c.GymTel == "" {
		return c.Runtime
	}
	return c.Runtime + "/gymtel-" + c.GymTel + "-" + c.GymSpec
}

// baselineSuffix names a row's twin run with the --baseline binary.
const baselineSuffix = ", baseline"

// rowConfigs is every workload row: workloadConfigs and, with a baseline
// binary, each traced row's twin right after it, so that the two binaries
// are interleaved in every round.
func rowConfigs(baseline bool) []wlConfig {
	if !baseline {
		return workloadConfigs
	}
	var out []wlConfig
	for _, c := range workloadConfigs {
		out = append(out, c)
		if c.Traced {
			b := c
			b.Name += baselineSuffix
			b.Baseline = true
			out = append(out, b)
		}
	}
	return out
}

// modeRows drops the full-only rows from a --short run.
func modeRows(configs []wlConfig, short bool) []wlConfig {
	if !short {
		return configs
	}
	return slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return c.FullOnly })
}

// The runtimes with a Debian root of their own (test/python/make-root.sh),
// each on a stack of its own whose rows compare with its own untraced row.
const (
	// runtimeGym: Gym's own runtime, CPython 3.13 with uvloop 0.21 and
	// httptools (Debian 13's).
	runtimeGym = "gym"
	// runtimeSid: Debian sid's CPython 3.14 with uvloop 0.23 and httptools,
	// the one root that packages the OTel Python SDK: gymtrace and Gym's own
	// telemetry side by side on the same interpreter and loop.
	runtimeSid = "sid"
	// runtimeSidAsyncio: the same root on the default asyncio loop (Gym's
	// fallback when uvloop is missing), full runs only.
	runtimeSidAsyncio = "sid-asyncio"
)

// gymTelRows are the "Gym telemetry" rows of a runtime: both presets the
// gymtrace rows run, with the OTLP exporter (A) and the no-op one (B).
func gymTelRows(runtime, suffix string, fullOnly bool) []wlConfig {
	var out []wlConfig
	for _, spec := range []string{"default", "per_rollout"} {
		for _, e := range []struct{ exp, name string }{{"otlp", "OTLP"}, {"noop", "no-op"}} {
			out = append(out, wlConfig{Name: "Gym telemetry " + spec + ", " + e.name + ", " + suffix, Runtime: runtime,
				GymTel: e.exp, GymSpec: spec, FullOnly: fullOnly})
		}
	}
	return out
}

var workloadConfigs = slices.Concat([]wlConfig{
	{Name: "untraced"},
	{Name: "groups off", Traced: true, Spec: ""},
	// Gym's metrics are on by default (every traced row has them, with a
	// Prometheus reader: the bench scrapes --metrics-addr); this row
	// measures what they cost.
	{Name: "default", Traced: true, Spec: "default"},
	{Name: "default, Gym metrics off", Traced: true, Spec: "default", Args: []string{"--gym-metrics=false"}},
	{Name: "per_rollout", Traced: true, Spec: "per_rollout"},
	{Name: "all", Traced: true, Spec: "all"},
	{Name: "verify, gate", Traced: true, Spec: "verify"},
	{Name: "verify, no gate", Traced: true, Spec: "verify", NoGate: true},
	// On a kernel whose self-test keeps injection off (FIONREAD in a
	// sockhash), the rows above run without it; this one measures what
	// the injection path (sys_enter decision, sockhash, sk_msg) costs.
	{Name: "default, injection forced", Traced: true, Spec: "default", Args: []string{"--inject-force"}},
	{Name: "untraced, Gym runtime", Runtime: runtimeGym},
	{Name: "default, Gym runtime", Traced: true, Spec: "default", Runtime: runtimeGym},
	{Name: "per_rollout, Gym runtime", Traced: true, Spec: "per_rollout", Runtime: runtimeGym},
	// gymtrace against Gym's own in-process telemetry, on sid's 3.14.
	{Name: "untraced, sid", Runtime: runtimeSid},
	{Name: "default, sid", Traced: true, Spec: "default", Runtime: runtimeSid},
	{Name: "per_rollout, sid", Traced: true, Spec: "per_rollout", Runtime: runtimeSid},
}, gymTelRows(runtimeSid, "sid", false), []wlConfig{
	{Name: "untraced, sid asyncio", Runtime: runtimeSidAsyncio, FullOnly: true},
	{Name: "default, sid asyncio", Traced: true, Spec: "default", Runtime: runtimeSidAsyncio, FullOnly: true},
	{Name: "per_rollout, sid asyncio", Traced: true, Spec: "per_rollout", Runtime: runtimeSidAsyncio, FullOnly: true},
}, gymTelRows(runtimeSidAsyncio, "sid asyncio", true))

// baseOf is the untraced configuration a configuration is compared with.
func baseOf(cfg wlConfig) string {
	switch cfg.Runtime {
	case runtimeGym:
		return "untraced, Gym runtime"
	case runtimeSid:
		return "untraced, sid"
	case runtimeSidAsyncio:
		return "untraced, sid asyncio"
	}
	return "untraced"
}

// pyRoot is a Debian root with a Python and the web stack, run under chroot.
type pyRoot struct {
	suite, env, dflt, python string
	loop, http               string // the stack's --loop and --http there
}

var pyRoots = map[string]pyRoot{
	runtimeGym:        {suite: "trixie", env: "GYMTRACE_TRIXIE_ROOT", dflt: "/var/tmp/gymtrace-trixie", python: "/usr/bin/python3.13", loop: "uvloop", http: "httptools"},
	runtimeSid:        {suite: "sid", env: "GYMTRACE_SID_ROOT", dflt: "/var/tmp/gymtrace-sid", python: "/usr/bin/python3.14", loop: "uvloop", http: "httptools"},
	runtimeSidAsyncio: {suite: "sid", env: "GYMTRACE_SID_ROOT", dflt: "/var/tmp/gymtrace-sid", python: "/usr/bin/python3.14", loop: "asyncio", http: "httptools"},
}

func (r pyRoot) dir() string {
	if d := os.Getenv(r.env); d != "" {
		return d
	}
	return r.dflt
}

// missing says why the root cannot run the stack, "" when it can.
func (r pyRoot) missing() string {
	root := r.dir()
	py := filepath.Base(r.python)
	if _, err := os.Stat(filepath.Join(root, r.python)); err != nil {
		return fmt.Sprintf("no Debian %s root with %s at %s: run test/python/make-root.sh %s (scripts/setup --tests does)", r.suite, py, root, r.suite)
	}
	if out, err := exec.Command("chroot", root, r.python, "-c", "import uvloop, httptools, fastapi, aiohttp, yaml").CombinedOutput(); err != nil {
		return fmt.Sprintf("the Debian %s root at %s lacks uvloop/httptools/fastapi/aiohttp/yaml: %v %s", r.suite, root, err, tail(string(out), 200))
	}
	return ""
}

// gymTelMissing says why the root cannot run Gym's own telemetry.
func (r pyRoot) gymTelMissing() string {
	root := r.dir()
	if out, err := exec.Command("chroot", root, r.python, "-c",
		"import opentelemetry.sdk.trace, opentelemetry.sdk.metrics, opentelemetry.exporter.otlp.proto.http.trace_exporter").CombinedOutput(); err != nil {
		return fmt.Sprintf("the Debian %s root at %s lacks the OTel Python SDK (%s): install the Debian packages "+
			"python3-opentelemetry-sdk and python3-opentelemetry-exporter-otlp-proto-http into it "+
			"(rm -rf %s && test/python/make-root.sh %s; scripts/setup --tests builds it with them)",
			r.suite, root, tail(string(out), 160), root, r.suite)
	}
	return ""
}

// gymRuntimeMissing says why the Gym-runtime rows cannot run, "" when they can.
func gymRuntimeMissing() string { return pyRoots[runtimeGym].missing() }

// skipReasons says, per row, why it cannot run here (rows not named run).
// sink is the OTLP sink binary the OTLP rows export to, "" none.
func skipReasons(configs []wlConfig, sink string) map[string]string {
	memo := map[string]string{}
	check := func(key string, f func() string) string {
		if w, ok := memo[key]; ok {
			return w
		}
		memo[key] = f()
		return memo[key]
	}
	out := map[string]string{}
	for _, c := range configs {
		r, chrooted := pyRoots[c.Runtime]
		why := ""
		if chrooted {
			why = check(r.suite+r.python, r.missing)
		}
		if why == "" && c.GymTel != "" {
			if !chrooted {
				why = "Gym's own telemetry runs only on a Debian root that packages the OTel SDK"
			} else {
				why = check("otel:"+r.suite, r.gymTelMissing)
			}
		}
		if why == "" && c.GymTel == "otlp" && sink == "" {
			why = "no OTLP sink for the OTLP exporter: pass --otlpsink (scripts/bench builds test/otlpsink)"
		}
		if why != "" {
			out[c.Name] = why
		}
	}
	return out
}

// progDelta is one program's bpf_stats over a run.
type progDelta struct {
	ID        uint32 `json:"id"`
	Name      string `json:"name"`
	Type      string `json:"type"`
	Hits      uint64 `json:"hits"`       // every run, any process on the host
	RuntimeNs uint64 `json:"runtime_ns"` // their total run time
	// TargetHits are the runs in the traced servers (from the hit counter;
	// 0 for programs not on a syscall hook).
	TargetHits uint64 `json:"target_hits"`
	// The idle window just before the run: only the rest of the host
	// (and a few idle syscalls of the servers) ran the program, which gives
	// the cost of a hit that stops at the target check.
	IdleHits       uint64 `json:"idle_hits"`
	IdleTargetHits uint64 `json:"idle_target_hits"`
	IdleRuntimeNs  uint64 `json:"idle_runtime_ns"`
}

// targetsOnly: a program that runs for the traced servers alone, so all its
// hits are counted as theirs: a uprobe fires only in processes that map the
// probed binary (here the traced Python servers), and the sk_msg program
// only for sockets in the injection sockhash (the targets' outbound ones).
func (p progDelta) targetsOnly() bool { return p.Type == "Kprobe" || p.Type == "SkMsg" }

// targetHits are the runs on behalf of the traced servers.
func (p progDelta) targetHits() uint64 {
	if p.targetsOnly() {
		return p.Hits
	}
	return p.TargetHits
}

// hostNsPerHit is the cost of a run of this program for a process that is
// not traced, from the idle window; NaN when the window saw none.
func (p progDelta) hostNsPerHit() float64 {
	if p.targetsOnly() || p.IdleHits <= p.IdleTargetHits {
		return math.NaN()
	}
	return float64(p.IdleRuntimeNs) / float64(p.IdleHits-p.IdleTargetHits)
}

// targetRuntimeNs is the run time spent on the traced servers' syscalls:
// the total less the host's hits at the idle cost per hit.
func (p progDelta) targetRuntimeNs() float64 {
	if p.targetsOnly() {
		return float64(p.RuntimeNs)
	}
	if p.TargetHits == 0 {
		return 0
	}
	c := p.hostNsPerHit()
	if math.IsNaN(c) {
		c = 0
	}
	rt := float64(p.RuntimeNs) - float64(p.Hits-min(p.Hits, p.TargetHits))*c
	return math.Max(rt, 0)
}

// wlRun is one run of the workload under one configuration.
type wlRun struct {
	Config        string      `json:"config"`
	Round         int         `json:"round"`
	Rollouts      int         `json:"rollouts"`
	OK            int         `json:"ok"`
	ElapsedS      float64     `json:"elapsed_s"`
	RolloutsPerS  float64     `json:"rollouts_per_s"`
	P50Ms         float64     `json:"p50_ms"`
	P99Ms         float64     `json:"p99_ms"`
	Requests      int         `json:"requests"` // HTTP requests the three servers served
	StackCPUMs    float64     `json:"stack_cpu_ms"`
	Progs         []progDelta `json:"programs,omitempty"`
	TargetHits    uint64      `json:"target_syscall_hits"` // the servers' syscalls on gymtrace's hooks
	RingBytes     uint64      `json:"ring_bytes,omitempty"`
	Records       float64     `json:"records,omitempty"` // ring-buffer records the agent read
	GateFlags     uint32      `json:"gate_flags,omitempty"`
	TracerCPUMs   float64     `json:"tracer_cpu_ms,omitempty"`
	TracerHWMB    uint64      `json:"tracer_peak_rss_bytes,omitempty"`
	SpansBuilt    float64     `json:"spans_built,omitempty"`
	RingbufFailed float64     `json:"ringbuf_reserve_failures,omitempty"`
	// Gym-telemetry rows: spans the batch queue dropped (SpansBuilt are
	// the spans Gym's telemetry exported).
	GymSpansDropped float64 `json:"gym_spans_dropped,omitempty"`
	Invalid         string  `json:"invalid,omitempty"`
}

// stack is the Gym-shaped test stack, started once and kept warm.
type stack struct {
	launcher  *child
	pids      map[string]int    // agent, model, resources
	urls      map[string]string // their base URLs
	collector []string
	truth     string
	truthOff  int64
	// chroot: the Python root the stack runs in, "" for the host's; its
	// files are written inside it (inside) and read from here (host).
	chroot, inside, host string
	gymTel               bool // the servers run Gym's own telemetry (flush endpoint)
}

type readyLine struct {
	Event   string `json:"event"`
	Error   string `json:"error"`
	Servers map[string]struct {
		PID int    `json:"pid"`
		URL string `json:"url"`
	} `json:"servers"`
	CollectorArgv []string `json:"collector_argv"`
}

// startStack starts the stack of runtime; extra goes to launch.py (Gym
// telemetry options).
func startStack(ctx context.Context, root, dir string, warmup int, runtime string, extra []string) (*stack, error) {
	truth := filepath.Join(dir, "truth.jsonl")
	var args []string
	var chroot, inDir, hostDir string
	if r, ok := pyRoots[runtime]; ok {
		// The chrooted servers see the stack and the truth file inside the
		// root: both go there, and the truth is read back from the host.
		croot := r.dir()
		host, err := os.MkdirTemp(filepath.Join(croot, "tmp"), "gymtrace-bench-")
		if err != nil {
			return nil, err
		}
		if out, err := exec.Command("cp", "-r", filepath.Join(root, "test/stack"), filepath.Join(host, "stack")).CombinedOutput(); err != nil {
			os.RemoveAll(host)
			return nil, fmt.Errorf("copying test/stack into %s: %v %s", host, err, out)
		}
		inside := "/" + strings.TrimPrefix(host, croot+"/")
		chroot, inDir, hostDir = croot, inside, host
		truth = filepath.Join(host, "truth.jsonl")
		args = []string{"--python", "chroot " + croot + " " + r.python, "--stack-dir", inside + "/stack",
			"--loop", r.loop, "--http", r.http, "--truth", inside + "/truth.jsonl"}
	} else {
		args = []string{"--truth", truth}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	argv := append([]string{"/usr/bin/python3", filepath.Join(root, "test/stack/launch.py"), "--serve",
		"--warmup", strconv.Itoa(warmup), "--log-dir", filepath.Join(dir, "stack")}, append(args, extra...)...)
	c, err := startChild("test stack", argv, nil, filepath.Join(dir, "launch.log"), pw)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	first := make(chan string, 1)
	go func() {
		br := bufio.NewReader(pr)
		l, _ := br.ReadString('\n')
		first <- l
		io.Copy(io.Discard, br)
		pr.Close()
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(120 * time.Second):
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("the test stack printed no ready line within 120s:\n%s", c.logTail())
	}
	var rl readyLine
	if err := json.Unmarshal([]byte(line), &rl); err != nil || rl.Event != "ready" {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("the test stack did not start (%q %s):\n%s", strings.TrimSpace(line), rl.Error, c.logTail())
	}
	s := &stack{launcher: c, pids: map[string]int{}, urls: map[string]string{}, collector: rl.CollectorArgv, truth: truth,
		chroot: chroot, inside: inDir, host: hostDir, gymTel: slices.Contains(extra, "--gym-telemetry")}
	for _, role := range []string{"agent", "model", "resources"} {
		p := rl.Servers[role].PID
		if p == 0 {
			c.stop(5 * time.Second)
			return nil, fmt.Errorf("the test stack's ready line has no %s pid: %s", role, line)
		}
		s.pids[role] = p
		s.urls[role] = rl.Servers[role].URL
	}
	time.Sleep(400 * time.Millisecond) // let the warmup's truth records flush
	s.countRequests()
	return s, nil
}

// gymTelCounts is what the Gym-telemetry servers made and exported
// (test/stack/gymtel.py's flush endpoint), summed over the three.
type gymTelCounts struct {
	SpansEnded          float64 `json:"spans_ended"`
	SpansExported       float64 `json:"spans_exported"`
	SpansFailed         float64 `json:"spans_failed"`
	SpansDropped        float64 `json:"spans_dropped"`
	MetricExportsFailed float64 `json:"metric_exports_failed"`
	Flushed             bool    `json:"flushed"`
}

// flushGymTel has every server export what its batch processor holds, and
// returns the counts once they have.
func (s *stack) flushGymTel(ctx context.Context) (gymTelCounts, error) {
	var sum gymTelCounts
	sum.Flushed = true
	cl := &http.Client{Timeout: 30 * time.Second}
	for _, role := range []string{"agent", "model", "resources"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.urls[role]+"/_gymtel/flush", nil)
		if err != nil {
			return sum, err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return sum, fmt.Errorf("flushing the %s server's Gym telemetry: %w", role, err)
		}
		var c gymTelCounts
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return sum, fmt.Errorf("flushing the %s server's Gym telemetry: status %d, %v", role, resp.StatusCode, err)
		}
		sum.SpansEnded += c.SpansEnded
		sum.SpansExported += c.SpansExported
		sum.SpansFailed += c.SpansFailed
		sum.SpansDropped += c.SpansDropped
		sum.MetricExportsFailed += c.MetricExportsFailed
		sum.Flushed = sum.Flushed && c.Flushed
	}
	return sum, nil
}

func (s *stack) pidArg() string {
	return fmt.Sprintf("%d=agent,%d=model,%d=resources", s.pids["agent"], s.pids["model"], s.pids["resources"])
}

func (s *stack) cpu() (time.Duration, error) {
	var sum time.Duration
	for role, p := range s.pids {
		u, err := readProcUsage(p)
		if err != nil {
			return 0, fmt.Errorf("the %s server: %w", role, err)
		}
		sum += u.CPU
	}
	return sum, nil
}

// countRequests counts the "in" truth records (one per request a server
// finished) written since the last call.
func (s *stack) countRequests() int {
	f, err := os.Open(s.truth)
	if err != nil {
		return 0
	}
	defer f.Close()
	f.Seek(s.truthOff, io.SeekStart)
	data, _ := io.ReadAll(f)
	// Only whole lines: a flush in progress is counted next time.
	end := bytes.LastIndexByte(data, '\n') + 1
	s.truthOff += int64(end)
	n := 0
	for _, line := range bytes.Split(data[:end], []byte("\n")) {
		var r struct {
			Ev string `json:"ev"`
		}
		if json.Unmarshal(line, &r) == nil && r.Ev == "in" {
			n++
		}
	}
	return n
}

func (s *stack) stop() error {
	err := s.launcher.stop(20 * time.Second)
	if s.host != "" {
		os.RemoveAll(s.host)
	}
	return err
}

type collectorSummary struct {
	Rollouts     int     `json:"rollouts"`
	OK           int     `json:"ok"`
	ElapsedS     float64 `json:"elapsed_s"`
	RolloutsPerS float64 `json:"rollouts_per_s"`
	Errors       []any   `json:"errors"`
}

// collect runs the collector once and returns its summary and the /run
// latency of every rollout (seconds).
func (s *stack) collect(ctx context.Context, dir string, rollouts, conc int) (collectorSummary, []float64, error) {
	var sum collectorSummary
	results, arg := filepath.Join(dir, "results.jsonl"), ""
	if s.chroot != "" {
		results, arg = filepath.Join(s.host, "results.jsonl"), filepath.Join(s.inside, "results.jsonl")
	} else {
		arg = results
	}
	os.Remove(results)
	argv := append(append([]string{}, s.collector...), "--rollouts", strconv.Itoa(rollouts),
		"--concurrency", strconv.Itoa(conc), "--results", arg)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		return sum, nil, fmt.Errorf("the collector printed no summary (%v): %s", runErr, tail(errb.String(), 800))
	}
	var lat []float64
	data, err := os.ReadFile(results)
	if err != nil {
		return sum, nil, fmt.Errorf("reading the collector's per-rollout results: %w", err)
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		var r struct {
			Status    *int    `json:"status"`
			DurationS float64 `json:"duration_s"`
		}
		if json.Unmarshal(l, &r) == nil && r.Status != nil && *r.Status == 200 {
			lat = append(lat, r.DurationS)
		}
	}
	return sum, lat, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// wlOptions size the workload phase.
type wlOptions struct {
	Root, Dir, Gymtrace string
	Baseline            string // --baseline: an older gymtrace binary, "" none
	Rounds, Rollouts    int
	Concurrency, Warmup int
	Idle                time.Duration // idle window before each traced run
	Log                 *slog.Logger
	Configs             string // --configs: a filter on row names; "" all
	Short               bool   // --short: no full-only rows
	Sink                string // test/otlpsink binary, for the Gym-telemetry OTLP rows; "" none
}

// pick keeps the rows a --configs filter names, and their untraced rows.
func pick(configs []wlConfig, filter string) []wlConfig {
	if filter == "" {
		return configs
	}
	keep := map[string]bool{}
	for _, c := range configs {
		for _, w := range strings.Split(filter, ",") {
			if w = strings.TrimSpace(w); w != "" && strings.Contains(c.Name, w) {
				keep[c.Name] = true
				keep[baseOf(c)] = true
			}
		}
	}
	return slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return !keep[c.Name] })
}

// workloadRows are the rows a run measures before skips: the --configs
// filter applied to the rows of the mode.
func workloadRows(baseline bool, filter string, short bool) []wlConfig {
	return pick(modeRows(rowConfigs(baseline), short), filter)
}

// runWorkload runs every configuration Rounds times, interleaved. Each
// stack (one per runtime and Gym telemetry setup) is started once and kept
// warm. skipped names the rows that cannot run here, with why.
func runWorkload(ctx context.Context, o wlOptions) (runs []wlRun, skipped map[string]string, err error) {
	type rt struct {
		st   *stack
		slot int
	}
	rts := map[string]*rt{}
	configs := workloadRows(o.Baseline != "", o.Configs, o.Short)
	skipped = skipReasons(configs, o.Sink)
	byWhy := map[string][]string{}
	var whys []string
	for _, c := range configs {
		if w := skipped[c.Name]; w != "" {
			if byWhy[w] == nil {
				whys = append(whys, w)
			}
			byWhy[w] = append(byWhy[w], c.Name)
		}
	}
	for _, w := range whys {
		o.Log.Warn("workload rows skipped", "rows", strings.Join(byWhy[w], "; "), "why", w)
	}
	configs = slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return skipped[c.Name] != "" })

	var keys []string
	extra := map[string][]string{}
	needSink := false
	for _, c := range configs {
		k := c.stackKey()
		if _, ok := extra[k]; ok {
			continue
		}
		keys = append(keys, k)
		extra[k] = nil
		if c.GymTel != "" {
			extra[k] = []string{"--gym-telemetry", c.GymTel, "--gym-span-groups", c.GymSpec}
			needSink = needSink || c.GymTel == "otlp"
		}
	}
	if needSink {
		// One sink for every OTLP row, counting only (as a collector's
		// receiver): its CPU is not the stack's, as gymtrace's is not.
		sink, addrs, err := startListeningN("otlpsink", []string{o.Sink, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--count-only"},
			filepath.Join(workDir(o.Dir, "workload"), "otlpsink.log"), 2)
		if err != nil {
			return nil, skipped, fmt.Errorf("starting the OTLP sink for the Gym-telemetry rows: %w", err)
		}
		defer sink.stop(5 * time.Second)
		httpAddr, ok := strings.CutPrefix(addrs[1], "listening-http ")
		if !ok {
			return nil, skipped, fmt.Errorf("the OTLP sink printed %q, not \"listening-http HOST:PORT\" (a sink without --http-listen?)", addrs[1])
		}
		for k, e := range extra {
			if slices.Contains(e, "otlp") {
				extra[k] = append(e, "--gym-telemetry-endpoint", "http://"+httpAddr)
			}
		}
		o.Log.Info("OTLP sink up for the Gym-telemetry rows", "http", httpAddr)
	}
	hc, err := newHitCounter(append(append([]string(nil), gymtraceHooks...), injectHooks...), max(len(keys), 1))
	if err != nil {
		return nil, skipped, err
	}
	defer hc.Close()
	for i, k := range keys {
		runtime := k
		if r, _, found := strings.Cut(k, "/"); found {
			runtime = r
		}
		st, err := startStack(ctx, o.Root, workDir(o.Dir, "workload-"+slug(k)), o.Warmup, runtime, extra[k])
		if err != nil {
			return nil, skipped, fmt.Errorf("the %q stack: %w", k, err)
		}
		defer st.stop()
		o.Log.Info("test stack up", "stack", k, "pids", st.pidArg())
		if err := hc.Watch(i, []int{st.pids["agent"], st.pids["model"], st.pids["resources"]}); err != nil {
			return nil, skipped, err
		}
		// One unrecorded run first: the servers' first collection after
		// start is slower (lazy imports, first connections), and it must
		// not land in a measured round.
		if _, _, err := st.collect(ctx, workDir(o.Dir, "workload"), o.Rollouts, o.Concurrency); err != nil {
			return nil, skipped, fmt.Errorf("settling run of the %q stack: %w", k, err)
		}
		rts[k] = &rt{st, i}
	}

	for r := 0; r < o.Rounds; r++ {
		for _, i := range rotation(len(configs), r) {
			cfg := configs[i]
			if ctx.Err() != nil {
				return runs, skipped, ctx.Err()
			}
			x := rts[cfg.stackKey()]
			run, err := runOnce(ctx, o, x.st, hc, x.slot, cfg, r)
			if err != nil {
				return runs, skipped, fmt.Errorf("workload %q, round %d: %w", cfg.Name, r+1, err)
			}
			o.Log.Info("workload run", "round", r+1, "config", cfg.Name, "rollouts_per_s", run.RolloutsPerS,
				"p50_ms", fmt.Sprintf("%.1f", run.P50Ms), "requests", run.Requests, "invalid", run.Invalid)
			runs = append(runs, run)
		}
	}
	return runs, skipped, nil
}

func runOnce(ctx context.Context, o wlOptions, st *stack, hc *hitCounter, slot int, cfg wlConfig, round int) (wlRun, error) {
	run := wlRun{Config: cfg.Name, Round: round}
	dir := workDir(o.Dir, "workload")
	var gt *gymtrace
	if cfg.Traced {
		var err error
		bin := o.Gymtrace
		if cfg.Baseline {
			bin = o.Baseline
		}
		gt, err = startGymtrace(ctx, gymtraceOptions{
			Bin: bin,
			Args: append([]string{"--pid", st.pidArg(), "--span-groups", cfg.Spec,
				"--exporter", "jsonl", "--output", "/dev/null"}, cfg.Args...),
			NoGate:  cfg.NoGate,
			LogPath: filepath.Join(dir, fmt.Sprintf("gymtrace-r%d-%s.log", round, slug(cfg.Name))),
		})
		if err != nil {
			return run, err
		}
		defer gt.stop(15 * time.Second)
	}
	var kIdle kernelSnap
	var hIdle map[string]uint64
	var err error
	if gt != nil {
		if kIdle, err = snapKernel(gt.pid()); err != nil {
			return run, err
		}
		if hIdle, err = hc.Read(slot); err != nil {
			return run, err
		}
		time.Sleep(o.Idle)
	}
	var tel0 gymTelCounts
	if st.gymTel {
		// Nothing is pending here (the last run ended with a flush): this
		// only reads the counts.
		if tel0, err = st.flushGymTel(ctx); err != nil {
			return run, err
		}
	}
	st.countRequests() // discard anything before this run
	cpu0, err := st.cpu()
	if err != nil {
		return run, err
	}
	h0, err := hc.Read(slot)
	if err != nil {
		return run, err
	}
	var k0 kernelSnap
	var m0 Metrics
	if gt != nil {
		if k0, err = snapKernel(gt.pid()); err != nil {
			return run, err
		}
		if m0, err = scrapeMetrics(gt.metricsAddr); err != nil {
			return run, err
		}
	}

	sum, lat, err := st.collect(ctx, dir, o.Rollouts, o.Concurrency)
	if err != nil {
		return run, err
	}
	var tel1 gymTelCounts
	if st.gymTel {
		// Gym's batch processor exports every 512 spans and every 5 s: the
		// rest of this run's spans are exported now, inside the measured
		// window, so that every span's export is paid by the run that made
		// it. (The metric reader keeps its own 10 s period.)
		if tel1, err = st.flushGymTel(ctx); err != nil {
			return run, err
		}
	}
	// The servers flush their truth records every 200 ms.
	time.Sleep(300 * time.Millisecond)
	cpu1, err := st.cpu()
	if err != nil {
		return run, err
	}
	run.Requests = st.countRequests()
	h1, err := hc.Read(slot)
	if err != nil {
		return run, err
	}
	for _, h := range gymtraceHooks {
		run.TargetHits += h1[h] - h0[h]
	}
	run.Rollouts, run.OK, run.ElapsedS, run.RolloutsPerS = sum.Rollouts, sum.OK, sum.ElapsedS, sum.RolloutsPerS
	run.StackCPUMs = float64(cpu1-cpu0) / 1e6
	run.P50Ms = Percentile(lat, 50) * 1000
	run.P99Ms = Percentile(lat, 99) * 1000
	if sum.OK != sum.Rollouts {
		run.Invalid = fmt.Sprintf("%d of %d rollouts failed: %v", sum.Rollouts-sum.OK, sum.Rollouts, sum.Errors)
	}
	if st.gymTel {
		run.SpansBuilt = tel1.SpansExported - tel0.SpansExported
		run.GymSpansDropped = tel1.SpansDropped - tel0.SpansDropped
		switch {
		case tel1.SpansFailed > tel0.SpansFailed || tel1.MetricExportsFailed > tel0.MetricExportsFailed:
			run.Invalid = fmt.Sprintf("Gym telemetry exports failed (%v spans, %v metric exports): the sink did not take them",
				tel1.SpansFailed-tel0.SpansFailed, tel1.MetricExportsFailed-tel0.MetricExportsFailed)
		case !tel1.Flushed:
			run.Invalid = "Gym telemetry's span processor did not flush within 10 s"
		}
	}
	if gt == nil {
		return run, nil
	}
	k1, err := snapKernel(gt.pid())
	if err != nil {
		return run, err
	}
	m1, err := scrapeMetrics(gt.metricsAddr)
	if err != nil {
		return run, err
	}
	run.Progs = progDeltas(kIdle, k0, k1, hIdle, h0, h1)
	run.RingBytes = k1.RingPos - k0.RingPos
	run.GateFlags = k1.GateFlags
	run.TracerCPUMs = float64(k1.Usage.CPU-k0.Usage.CPU) / 1e6
	run.TracerHWMB = k1.Usage.HWMBytes
	run.SpansBuilt = m1.Sum("gymtrace_spans_built_total") - m0.Sum("gymtrace_spans_built_total")
	run.RingbufFailed = m1.Sum("gymtrace_ringbuf_reserve_failures_total") - m0.Sum("gymtrace_ringbuf_reserve_failures_total")
	run.Records = m1.Sum("gymtrace_ringbuf_records_read_total") - m0.Sum("gymtrace_ringbuf_records_read_total")
	if err := gt.stop(15 * time.Second); err != nil {
		return run, fmt.Errorf("stopping gymtrace: %w", err)
	}
	return run, nil
}

// progDeltas: idle window [ki, k0], run [k0, k1]; h* are the hit counter's
// readings at the same moments.
func progDeltas(ki, k0, k1 kernelSnap, hi, h0, h1 map[string]uint64) []progDelta {
	var out []progDelta
	for id, p1 := range k1.Progs {
		p0, pi := k0.Progs[id], ki.Progs[id]
		d := progDelta{ID: id, Hits: p1.RunCnt - p0.RunCnt, RuntimeNs: p1.RunTimeNs - p0.RunTimeNs,
			IdleHits: p0.RunCnt - pi.RunCnt, IdleRuntimeNs: p0.RunTimeNs - pi.RunTimeNs}
		if meta, err := programMeta(id); err == nil {
			d.Name, d.Type = meta.Name, meta.Type
		}
		if h := hookOfProgram(d.Name); h != "" && d.Type == "TracePoint" {
			d.TargetHits = h1[h] - h0[h]
			d.IdleTargetHits = h0[h] - hi[h]
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}
