//go:build linux

package main

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestRatioCI(t *testing.T) {
	iv := RatioCI([]float64{0.98, 1.0, 1.02})
	if !near(iv.Mean, 0.99993, 1e-4) || iv.N != 3 {
		t.Fatalf("geometric mean = %+v", iv)
	}
	// t(2) = 4.303; sd of logs ~0.02 -> half-width ~0.0497 on the log scale.
	if !(iv.Lo < 0.96 && iv.Lo > 0.94 && iv.Hi > 1.04 && iv.Hi < 1.06) {
		t.Fatalf("interval = %+v, want about [0.951, 1.051]", iv)
	}
	if one := RatioCI([]float64{0.9}); one.N != 1 || one.Lo != one.Mean {
		t.Fatalf("one round must give a point: %+v", one)
	}
	if none := RatioCI([]float64{0, math.Inf(1)}); none.Valid() {
		t.Fatalf("no usable ratio must be invalid: %+v", none)
	}
}

func TestPercentileAndT(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if p := Percentile(xs, 50); p != 3 {
		t.Fatalf("p50 = %v", p)
	}
	if p := Percentile(xs, 0); p != 1 {
		t.Fatalf("p0 = %v", p)
	}
	if p := Percentile(xs, 99); !near(p, 4.96, 1e-9) {
		t.Fatalf("p99 = %v", p)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Fatal("no data must be NaN")
	}
	if tQuantile975(1) != 12.706 || tQuantile975(10) != 2.228 || tQuantile975(1000) != 1.96 {
		t.Fatal("t table")
	}
}

func TestRotation(t *testing.T) {
	// Every configuration runs once a round, and over each pair of rounds
	// it is as often before untraced (configuration 0) as after it, by the
	// same total distance: linear drift cancels from every paired ratio.
	for _, n := range []int{2, 4, 7} {
		for r0 := 0; r0 < 2*n; r0 += 2 {
			dist := make([]int, n)
			for r := r0; r < r0+2; r++ {
				order := rotation(n, r)
				pos := make([]int, n)
				seen := map[int]bool{}
				for p, c := range order {
					pos[c] = p
					seen[c] = true
				}
				if len(seen) != n || len(order) != n {
					t.Fatalf("n=%d round %d: order %v is not a permutation", n, r, order)
				}
				for c := range n {
					dist[c] += pos[c] - pos[0]
				}
			}
			for c, d := range dist {
				if d != 0 {
					t.Fatalf("n=%d rounds %d-%d: configuration %d is %d positions off untraced in sum, want 0", n, r0, r0+1, c, d)
				}
			}
		}
	}
	// The first configuration of a round changes as rounds go on.
	if rotation(7, 0)[0] == rotation(7, 2)[0] {
		t.Fatal("the rotation does not move")
	}
}

func TestParseProc(t *testing.T) {
	stat := "1234 (gym trace) (x)) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 9 0 100 1000 200"
	ut, st, err := parseStat(stat)
	if err != nil || ut != 250 || st != 75 {
		t.Fatalf("parseStat = %d %d %v", ut, st, err)
	}
	if _, _, err := parseStat("garbage"); err == nil {
		t.Fatal("garbage must fail")
	}
	if n := parsePreemptions("Name:\tpython3\nvoluntary_ctxt_switches:\t912\nnonvoluntary_ctxt_switches:\t37\n"); n != 37 {
		t.Fatalf("parsePreemptions = %d, want 37", n)
	}
	if n := parsePreemptions("Name:\tpython3\n"); n != 0 {
		t.Fatalf("parsePreemptions without the field = %d", n)
	}
	if counted(5, 9) != 4 || counted(9, 5) != 0 {
		t.Fatalf("counted(5, 9) = %v, counted(9, 5) = %v", counted(5, 9), counted(9, 5))
	}
	rss, hwm := parseStatus("Name:\tgymtrace\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n")
	if rss != 40960*1024 || hwm != 51200*1024 {
		t.Fatalf("parseStatus = %d %d", rss, hwm)
	}
	o := parseFDInfo("pos:\t0\nflags:\t02000002\nprog_type:\t5\nprog_jited:\t1\nprog_tag:\tbf07d4862ffa47f4\nprog_id:\t962\nrun_time_ns:\t63727\nrun_cnt:\t630\n")
	if !o.IsProg() || o.ProgID != 962 || o.RunTimeNs != 63727 || o.RunCnt != 630 || o.ProgType != 5 {
		t.Fatalf("prog fdinfo = %+v", o)
	}
	m := parseFDInfo("map_type:\t27\nkey_size:\t0\nmap_id:\t1612\n")
	if !m.IsMap() || m.MapType != 27 || m.MapID != 1612 {
		t.Fatalf("map fdinfo = %+v", m)
	}
}

func TestOwnUsage(t *testing.T) {
	u, err := readProcUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.RSSBytes == 0 || u.HWMBytes < u.RSSBytes {
		t.Fatalf("usage of this test = %+v", u)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP gymtrace_events_emitted_total Kernel HTTP events.
# TYPE gymtrace_events_emitted_total counter
gymtrace_events_emitted_total{group="server"} 12
gymtrace_events_emitted_total{group="verify"} 3
# TYPE gymtrace_ringbuf_reserve_failures_total counter
gymtrace_ringbuf_reserve_failures_total 0
# TYPE gymtrace_export_queue_length gauge
gymtrace_export_queue_length 7
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m.Sum("gymtrace_events_emitted_total") != 15 || m.Sum("gymtrace_export_queue_length") != 7 {
		t.Fatalf("metrics = %v", m)
	}
	if _, ok := m["gymtrace_ringbuf_reserve_failures_total"]; !ok {
		t.Fatal("a zero counter must be present")
	}
	if m.Sum("gymtrace_events") != 0 {
		t.Fatal("Sum must match whole names only")
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 3s test @ http://127.0.0.1:4000/
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   1.01ms  300.00us   5.00ms   90.00%
  61234 requests in 3.00s, 7.89MB read
Requests/sec:  20411.33
Transfer/sec:      2.63MB
`
	w, err := parseWrk(out)
	if err != nil || w.Requests != 61234 || w.Seconds != 3 || w.RPS != 20411.33 {
		t.Fatalf("parseWrk = %+v %v", w, err)
	}
	if _, err := parseWrk("wrk: connection refused"); err == nil {
		t.Fatal("an unreadable output must fail")
	}
}

func TestHookOfProgram(t *testing.T) {
	for name, want := range map[string]string{
		"gt_exit_read":     "sys_exit_read",
		"gt_exit_recvfrom": "sys_exit_recvfrom",
		"gt_exit_recvfro":  "sys_exit_recvfrom", // cut by the kernel
		"gt_enter_close":   "sys_enter_close",
		"gt_enter_accept4": "",                 // 16 bytes, unknown: cannot be completed
		"gt_exit_connect":  "sys_exit_connect", // 15 bytes: BTF gives full names, so taken as whole
		"gt_exit_accept":   "sys_exit_accept",
		"gt_exec":          "",
		"gt_fork":          "",
	} {
		if got := hookOfProgram(name); got != want {
			t.Errorf("hookOfProgram(%q) = %q, want %q", name, got, want)
		}
	}
}

// synthetic runs: default is 2 % slower than untraced in every round.
func syntheticReport() *Report {
	rep := &Report{}
	for r := 0; r < 3; r++ {
		rep.Raw.Workload = append(rep.Raw.Workload,
			wlRun{Config: "untraced", Round: r, Rollouts: 100, OK: 100, RolloutsPerS: 50 + float64(r), P50Ms: 80, P99Ms: 120, Requests: 900, StackCPUMs: 1000, TargetHits: 5400},
			wlRun{Config: "default", Round: r, Rollouts: 100, OK: 100, RolloutsPerS: (50 + float64(r)) * 0.97, P50Ms: 82, P99Ms: 126,
				Requests: 900, StackCPUMs: 1050, TracerCPUMs: 20, RingBytes: 100 * 34 * ringbufRecordBytes(), Records: 100 * 34, SpansBuilt: 1800, TargetHits: 5400,
				Progs: []progDelta{{ID: 1, Name: "gt_exit_sendto", Type: "TracePoint", Hits: 10000, RuntimeNs: 10000*100 + 3000*2000,
					TargetHits: 3000, IdleHits: 1000, IdleRuntimeNs: 100000}}})
	}
	rep.Raw.Tax = []taxRun{
		{Mode: "untraced", Round: 0, NsPer: map[string]float64{"write": 200, "read": 210, "sendto+recvfrom": 400, "getppid": 100}},
		{Mode: "empty", Round: 0, NsPer: map[string]float64{"write": 240, "read": 250, "sendto+recvfrom": 440, "getppid": 110}},
		{Mode: "gymtrace", Round: 0, NsPer: map[string]float64{"write": 250, "read": 280, "sendto+recvfrom": 450, "getppid": 112}},
	}
	rep.Raw.Capacity = []capRun{{Exporter: "jsonl", Seconds: 10, Requests: 300000, SpansBuilt: 300000, SpansPerS: 30000,
		TracerCPUMs: 3000, CoresUsed: 0.3, CPUMsPer1000: 10, SpansPerCoreSec: 100000, TracerPeakRSS: 120e6, TracerLoadRSS: 60e6}}
	rep.analyse()
	return rep
}

func TestAnalyse(t *testing.T) {
	rep := syntheticReport()
	var def *WorkloadRow
	for i := range rep.Workload {
		if rep.Workload[i].Config == "default" {
			def = &rep.Workload[i]
		}
	}
	if def == nil {
		t.Fatalf("no default row: %+v", rep.Workload)
	}
	if !near(def.Throughput.Mean, 0.97, 1e-9) || def.Verdict != "MISS" {
		t.Fatalf("default throughput %+v verdict %q, want 0.97 and MISS (target 0.98)", def.Throughput, def.Verdict)
	}
	// target runtime = total - host hits x idle cost = 7e6 - 7000 x 100 = 6.3e6 ns per run, / 900 requests.
	if !near(def.EBPFNsPerReq.Mean, 6.3e6/900, 1e-6) {
		t.Fatalf("eBPF ns/request = %+v, want %v", def.EBPFNsPerReq, 6.3e6/900)
	}
	if !near(def.RecordsPerRoll, 34, 1e-9) || !near(def.HitsPerReq, 6, 1e-9) {
		t.Fatalf("records/rollout %v hits/req %v", def.RecordsPerRoll, def.HitsPerReq)
	}
	var p *ProgramRow
	for i := range rep.Programs {
		if rep.Programs[i].Program == "gt_exit_sendto" {
			p = &rep.Programs[i]
		}
	}
	if p == nil || !near(p.HostNsPerHit, 100, 1e-9) || !near(p.TargetNsPerHit, 2100, 1e-9) {
		t.Fatalf("program row = %+v, want host 100 ns/hit and target 2100 ns/hit", p)
	}
	for _, x := range rep.Tax {
		if x.Syscall == "read" && (!near(x.AboveFloor.Mean, 30, 1e-9) || x.Verdict != "MISS") {
			t.Fatalf("read tax = %+v", x)
		}
		if x.Syscall == "write" && (!near(x.Floor.Mean, 40, 1e-9) || x.Verdict != "ok") {
			t.Fatalf("write tax = %+v", x)
		}
	}
	if len(rep.Capacity) != 1 || rep.Capacity[0].Verdict != "ok" {
		t.Fatalf("capacity = %+v", rep.Capacity)
	}
	// The synthetic run lacks most configurations: the table is incomplete.
	if err := rep.complete(map[string]bool{"workload": true}); err == nil {
		t.Fatal("complete() must report the missing rows")
	}
	if err := rep.complete(map[string]bool{"tax": true, "capacity": true}); err != nil {
		t.Fatalf("tax and capacity are complete: %v", err)
	}
	var sb strings.Builder
	rep.Print(&sb)
	rep.Markdown(&sb)
	for _, want := range []string{"1. Gym-shaped workload", "gt_exit_sendto", "3. Tax", "4. Agent capacity", "| --- |"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("printed table lacks %q", want)
		}
	}
}

func TestJSONWithMissingFigures(t *testing.T) {
	rep := syntheticReport()
	rep.Workload[0].P99Ms = math.NaN()
	path := t.TempDir() + "/b.json"
	if err := writeJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("report JSON does not parse: %v", err)
	}
	w := back["workload"].([]any)[0].(map[string]any)
	if v, ok := w["p99_ms"]; !ok || v != nil {
		t.Fatalf("a NaN figure must be null, got %v (present %v)", v, ok)
	}
	if _, ok := w["throughput_ratio"]; !ok {
		t.Fatal("intervals must be encoded")
	}
}

// Privileged: the floor program and the hit counter really attach, and the
// counter counts this process's own syscalls and nobody else's.
func TestCounterAndFloor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF)")
	}
	f, err := attachEmptyFloor([]string{"sys_exit_write"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hc, err := newHitCounter([]string{"sys_exit_write", "sys_exit_read"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if err := hc.Watch(1, []int{os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	null, err := os.OpenFile("/dev/null", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	before, err := hc.Read(1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		unix.Write(int(null.Fd()), []byte("x"))
	}
	time.Sleep(10 * time.Millisecond)
	after, err := hc.Read(1)
	if err != nil {
		t.Fatal(err)
	}
	if d := after["sys_exit_write"] - before["sys_exit_write"]; d < 100 || d > 1000 {
		t.Fatalf("counted %d writes of this process, want about 100", d)
	}
	// Another slot's count does not move.
	if other, _ := hc.Read(0); other["sys_exit_write"] != 0 {
		t.Fatalf("slot 0 counted %d writes of slot 1's process", other["sys_exit_write"])
	}
	// Someone else's writes are not counted.
	hc.watched.Delete(uint32(os.Getpid()))
	b2, _ := hc.Read(1)
	for i := 0; i < 100; i++ {
		unix.Write(int(null.Fd()), []byte("x"))
	}
	a2, _ := hc.Read(1)
	if a2["sys_exit_write"] != b2["sys_exit_write"] {
		t.Fatalf("an unwatched process was counted: %d -> %d", b2["sys_exit_write"], a2["sys_exit_write"])
	}
}

// Programs that run for the targets alone (uprobes, sk_msg on the injection
// sockhash) count every hit as the targets'; a syscall hook only the hits
// the counter saw, less the host's share of its run time.
func TestTargetsOnlyPrograms(t *testing.T) {
	for _, typ := range []string{"Kprobe", "SkMsg"} {
		p := progDelta{Type: typ, Hits: 10, RuntimeNs: 5000}
		if p.targetHits() != 10 || p.targetRuntimeNs() != 5000 {
			t.Errorf("%s: target hits %d, run time %v; want all of them", typ, p.targetHits(), p.targetRuntimeNs())
		}
	}
	p := progDelta{Type: "TracePoint", Hits: 10, RuntimeNs: 5000, TargetHits: 4, IdleHits: 100, IdleRuntimeNs: 10000}
	if p.targetHits() != 4 || p.targetRuntimeNs() != 5000-6*100 {
		t.Errorf("tracepoint: target hits %d, run time %v; want 4 and 4400", p.targetHits(), p.targetRuntimeNs())
	}
}

// With --baseline every traced row has its twin right after it (the two
// builds interleaved in each round); a --configs filter keeps both.
func TestBaselineRows(t *testing.T) {
	rows := rowConfigs(true)
	twins := 0
	for i, c := range rows {
		if !c.Baseline {
			continue
		}
		twins++
		if i == 0 || rows[i-1].Name+baselineSuffix != c.Name || !rows[i-1].Traced || rows[i-1].Baseline {
			t.Errorf("twin %q does not follow its row", c.Name)
		}
	}
	traced := 0
	for _, c := range workloadConfigs {
		if c.Traced {
			traced++
		}
	}
	if twins != traced || len(rowConfigs(false)) != len(workloadConfigs) {
		t.Errorf("%d twins for %d traced rows", twins, traced)
	}
	got := pick(rowConfigs(true), "per_rollout")
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, "per_rollout") || !slices.Contains(names, "per_rollout"+baselineSuffix) || !slices.Contains(names, "untraced") {
		t.Errorf("pick(per_rollout) = %v", names)
	}
}

// The sid family: gymtrace rows and Gym-telemetry rows on the same runtime,
// each Gym-telemetry setup on a stack of its own, all against "untraced, sid".
func TestGymTelemetryRows(t *testing.T) {
	want := []string{"untraced, sid", "groups off, sid", "default, sid", "default, Gym metrics off, sid", "per_rollout, sid", "all, sid",
		"Gym telemetry default, OTLP, sid", "Gym telemetry default, no-op, sid",
		"Gym telemetry per_rollout, OTLP, sid", "Gym telemetry per_rollout, no-op, sid"}
	short := workloadRows(false, "sid", true)
	var names []string
	keys := map[string]string{}
	for _, c := range short {
		names = append(names, c.Name)
		if baseOf(c) != "untraced, sid" || c.Runtime != runtimeSid {
			t.Errorf("%s: runtime %q compared with %q", c.Name, c.Runtime, baseOf(c))
		}
		if c.GymTel != "" {
			if c.Traced || !c.compared() || (c.GymTel != "otlp" && c.GymTel != "noop") {
				t.Errorf("%s: %+v", c.Name, c)
			}
			if other, dup := keys[c.stackKey()]; dup {
				t.Errorf("%s and %s share a stack", c.Name, other)
			}
			keys[c.stackKey()] = c.Name
			if !strings.Contains(c.Name, c.GymSpec) {
				t.Errorf("%s runs span groups %q", c.Name, c.GymSpec)
			}
		} else if c.stackKey() != runtimeSid {
			t.Errorf("%s: stack %q", c.Name, c.stackKey())
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("--short --configs sid = %q, want %q", names, want)
	}
	// The asyncio family and the GenAI-off attribution row are for full runs.
	full := workloadRows(false, "sid", false)
	// ... with gymtrace at default and per_rollout (off and all run on uvloop).
	if len(full) != len(want)+8 || !slices.ContainsFunc(full, func(c wlConfig) bool { return c.Name == "Gym telemetry per_rollout, no-op, sid asyncio" }) ||
		!slices.ContainsFunc(full, func(c wlConfig) bool { return c.Name == "default, GenAI off, sid" }) {
		t.Errorf("full run, --configs sid: %d rows", len(full))
	}
	for _, c := range full {
		if slices.Contains(want, c.Name) || c.Name == "default, GenAI off, sid" {
			continue
		}
		if baseOf(c) != "untraced, sid asyncio" || pyRoots[c.Runtime].loop != "asyncio" {
			t.Errorf("%s: compared with %q on loop %q", c.Name, baseOf(c), pyRoots[c.Runtime].loop)
		}
	}
	// Every short row is in the default --short run, and no Gym-telemetry row has a baseline twin.
	all := workloadRows(true, "", true)
	for _, n := range want {
		if !slices.ContainsFunc(all, func(c wlConfig) bool { return c.Name == n }) {
			t.Errorf("--short lacks %q", n)
		}
	}
	for _, c := range all {
		if c.Baseline && c.GymTel != "" {
			t.Errorf("baseline twin of a Gym-telemetry row: %s", c.Name)
		}
	}
}

func TestSkipReasons(t *testing.T) {
	t.Setenv("GYMTRACE_SID_ROOT", t.TempDir())
	rows := workloadRows(false, "sid", true)
	why := skipReasons(append(rows, wlConfig{Name: "untraced"}), "")
	for _, c := range rows {
		if !strings.Contains(why[c.Name], "make-root.sh sid") {
			t.Errorf("%s: skip reason %q", c.Name, why[c.Name])
		}
	}
	if why["untraced"] != "" {
		t.Errorf("the host row is skipped: %q", why["untraced"])
	}
	// Every selected row skipped: nothing is missing from the table.
	rep := &Report{Skipped: why, Settings: Settings{Configs: "sid"}, Machine: Machine{Mode: "short"}}
	if err := rep.complete(map[string]bool{"workload": true}); err != nil {
		t.Errorf("complete() with every row skipped = %v", err)
	}
	notes := skipNotes(why)
	if len(notes) != 1 || !strings.Contains(notes[0], "Gym telemetry default, OTLP, sid") {
		t.Errorf("notes = %q", notes)
	}
	// The OTLP rows without a sink, on a root that is fine.
	if msg := skipReasons([]wlConfig{{Name: "x", GymTel: "otlp"}}, ""); !strings.Contains(msg["x"], "OTel SDK") {
		t.Errorf("Gym telemetry on the host: %q", msg["x"])
	}
	if !strings.Contains(pyRoot{suite: "sid", dflt: "/nonexistent", python: "/usr/bin/python3.14"}.gymTelMissing(), "python3-opentelemetry-sdk") {
		t.Error("the missing-SDK message must name the Debian packages")
	}
}

// A Gym-telemetry row gets ratios against its untraced row, its spans and
// drops, no tracer figures; table 6 sets it beside gymtrace's row.
func TestAnalyseGymTelemetry(t *testing.T) {
	rep := &Report{}
	for r := 0; r < 4; r++ {
		base := wlRun{Round: r, Rollouts: 100, OK: 100, RolloutsPerS: 50, P50Ms: 80, P99Ms: 120, Requests: 900, StackCPUMs: 1000}
		u, g, a, b := base, base, base, base
		u.Config = "untraced, sid"
		g.Config, g.StackCPUMs, g.TracerCPUMs, g.SpansBuilt = "default, sid", 1050, 20, 4600
		a.Config, a.StackCPUMs, a.SpansBuilt, a.RolloutsPerS = "Gym telemetry default, OTLP, sid", 1400, 4600, 40
		b.Config, b.StackCPUMs, b.SpansBuilt, b.GymSpansDropped = "Gym telemetry default, no-op, sid", 1200, 4600, 1
		rep.Raw.Workload = append(rep.Raw.Workload, u, g, a, b)
	}
	rep.analyse()
	rows := map[string]WorkloadRow{}
	for _, w := range rep.Workload {
		rows[w.Config] = w
	}
	a := rows["Gym telemetry default, OTLP, sid"]
	if !a.GymTelemetry || !near(a.StackCPU.Mean, 1.4, 1e-9) || !near(a.Throughput.Mean, 0.8, 1e-9) || !near(a.SpansPerRoll, 46, 1e-9) ||
		a.TracerCPUPct != 0 || a.EBPFNsPerReq.Valid() || a.Target != 0 {
		t.Fatalf("OTLP row = %+v", a)
	}
	if b := rows["Gym telemetry default, no-op, sid"]; !near(b.StackCPU.Mean, 1.2, 1e-9) || b.GymSpansDropped != 4 {
		t.Fatalf("no-op row = %+v", b)
	}
	if g := rows["default, sid"]; !near(g.TracerCPUPct, 2, 1e-9) || g.Target != 0.98 {
		t.Fatalf("gymtrace row = %+v", g)
	}
	var sb strings.Builder
	rep.Print(&sb)
	out := sb.String()
	for _, want := range []string{"6. gymtrace against Gym's own", "in process", "+40.0 %", "+20.0 %", "+7.0 %", "46.0 / 46.0", "(4 dropped)"} {
		if !strings.Contains(out, want) {
			t.Errorf("printed table lacks %q:\n%s", want, out)
		}
	}
	rep.Skipped = map[string]string{"Gym telemetry per_rollout, OTLP, sid": "x", "Gym telemetry per_rollout, no-op, sid": "x",
		"per_rollout, sid": "x", "groups off, sid": "x", "all, sid": "x", "default, Gym metrics off, sid": "x"}
	rep.Settings.Configs, rep.Machine.Mode = "sid", "short"
	if err := rep.complete(map[string]bool{"workload": true}); err == nil || strings.Contains(err.Error(), "sid") {
		t.Errorf("complete() = %v; want only the per-program rows missing (skipped rows are not)", err)
	}
}

// --configs "=NAME" picks that row alone (names hold commas, so such words
// are separated by ";"), with its untraced row and its baseline twin.
func TestConfigsExactNames(t *testing.T) {
	names := func(rows []wlConfig) []string {
		var out []string
		for _, c := range rows {
			out = append(out, c.Name)
		}
		return out
	}
	got := names(workloadRows(true, "=default, sid;=groups off, sid", false))
	want := []string{"untraced, sid", "groups off, sid", "groups off, sid, baseline", "default, sid", "default, sid, baseline"}
	if !slices.Equal(got, want) {
		t.Errorf("exact names = %q, want %q", got, want)
	}
	// A plain word still matches by substring, commas still separate words.
	if got := names(workloadRows(false, "per_rollout, Gym runtime", false)); !slices.Contains(got, "per_rollout, sid") ||
		!slices.Contains(got, "default, Gym runtime") {
		t.Errorf("words = %q", got)
	}
	if got := workloadRows(false, "=no such row", false); len(got) != 0 {
		t.Errorf("an unknown exact name picked %q", names(got))
	}
}

// The cost targets against untraced and against Gym's no-op telemetry.
func TestCostTargets(t *testing.T) {
	rep := &Report{Workload: []WorkloadRow{
		{Config: "default, sid", StackCPU: Interval{Mean: 1.04, Lo: 1.02, Hi: 1.06, N: 10}},
		{Config: "Gym telemetry default, no-op, sid", StackCPU: Interval{Mean: 1.80, Lo: 1.7, Hi: 1.9, N: 10}, GymTelemetry: true},
		{Config: "default, sid asyncio", StackCPU: Interval{Mean: 1.12, Lo: 1.10, Hi: 1.14, N: 10}},
		{Config: "Gym telemetry default, no-op, sid asyncio", StackCPU: Interval{Mean: 1.80, Lo: 1.7, Hi: 1.9, N: 10}, GymTelemetry: true},
	}}
	rep.targets()
	got := map[string]string{}
	for _, r := range rep.Targets {
		got[r.What] = r.Measured + " " + r.Verdict
	}
	want := map[string]string{
		"servers' added CPU per rollout, default, sid":                                                           "+4.0 % [+2.0, +6.0] ok?",
		"servers' added CPU per rollout, default, sid, as a share of Gym telemetry B's (no-op exporter)":         "0.050 [0.025, 0.075] ok",
		"servers' added CPU per rollout, default, sid asyncio":                                                   "+12.0 % [+10.0, +14.0] MISS",
		"servers' added CPU per rollout, default, sid asyncio, as a share of Gym telemetry B's (no-op exporter)": "0.150 [0.125, 0.175] MISS",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
