//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// End-to-end test of the startup group: a launcher shaped like Gym's
// (`gym env start`: an orchestrator that spawns one `bash -c` shell per server,
// each running a slow venv-like step and then the server, and waits for each
// server's health probe) logs its own marks on CLOCK_MONOTONIC, the kernel's
// clock; every boundary of the startup spans must lie between the two marks
// that bracket it, in order. Scheduling noise only widens a bracket; the one
// tolerance (startupSlack) is for the two wall-clock conversions (gymtrace's
// export and this test's reading of it), not for anything's speed.

// startupSlack bounds the disagreement between gymtrace's realtime-minus-
// monotonic offset, taken at its start, and this test's, taken at the check:
// both are sampled between two clock reads, and either can be preempted
// there. Every bracket below is set apart from its neighbours by a sleep of
// 300 ms or more, so a boundary given to the wrong event still fails.
const startupSlack = 50 * time.Millisecond

// The launcher, the venv-like step and the servers. Marks are JSON lines on
// stdout (each one write(2) under PIPE_BUF, so lines never interleave).
const startupMark = `import json, os, time
def mark(ev, **kw):
    kw.update(mark=ev, mono=time.monotonic_ns(), pid=os.getpid())
    os.write(1, (json.dumps(kw) + "\n").encode())
`

// gym: the orchestrator. Held at its first stdin line until the test has
// seen gymtrace trace it (Gym's spends seconds on Ray and its config before
// the first spawn; this one would spawn within milliseconds of its exec).
const startupOrchestrator = startupMark + `import socket, subprocess, sys, urllib.request
mark("orch_main")
sys.stdin.readline()
here = os.path.dirname(os.path.abspath(__file__))
py = sys.executable
procs = []
for s in json.loads(os.environ["STARTUP_SERVERS"]):
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    env = dict(os.environ, NEMO_GYM_CONFIG_PATH=s["name"], STARTUP_PORT=str(port), PYTHONPATH=here,
               NEMO_GYM_CONFIG_DICT="%s:\n  %s:\n    impl:\n      host: 127.0.0.1\n" % (s["name"], s["type"]))
    # exec: bash runs the server in its own process (as bash 5.1+ does for
    # the last command of -c by itself); otherwise bash waits for it, so it
    # forks it.
    srv = "%s %s/%s" % (py, here, s["entry"])
    cmd = "%s %s/venvstep.py && %s" % (py, here, ("exec " + srv) if s["exec"] else (srv + " || exit $?"))
    mark("spawn", name=s["name"])
    p = subprocess.Popen(["bash", "-c", cmd], env=env)
    mark("spawned", name=s["name"], shell=p.pid)
    procs.append((s["name"], port))
for name, port in procs:
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=10) as r:
                r.read()
            break
        except OSError:
            time.sleep(0.05)
    mark("probe_ok", name=name)
mark("all_ready")
sys.stdin.read()
`

// venvstep.py: uv venv and uv pip install, as far as timing goes.
const startupVenv = startupMark + `time.sleep(0.5)
mark("venv_done", name=os.environ["NEMO_GYM_CONFIG_PATH"])
`

// server.py: a plain server; a sleep stands for imports and the app's start.
const startupServer = startupMark + `import socket
name = os.environ["NEMO_GYM_CONFIG_PATH"]
mark("server_main", name=name)
time.sleep(0.4)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["STARTUP_PORT"])))
mark("pre_listen", name=name)
s.listen(16)
mark("post_listen", name=name)
time.sleep(0.3)  # the listen and the first answer, apart (the probe waits in the backlog)
while True:
    c, _ = s.accept()
    c.recv(65536)
    mark("respond", name=name)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    c.close()
`

// uvserver.py: uvicorn with two workers (Gym's num_workers > 1): uvicorn binds
// in this process, each worker's loop listens.
// The guard: multiprocessing's spawn runs this file again in each worker.
const startupUvicorn = startupMark + `import uvicorn
if __name__ == "__main__":
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    mark("server_main", name=name)
    time.sleep(0.4)
    uvicorn.run("uvapp:app", host="127.0.0.1", port=int(os.environ["STARTUP_PORT"]), workers=2, log_level="warning")
`

// uvapp.py: the workers' ASGI app, without FastAPI.
const startupUvApp = startupMark + `import asyncio
name = os.environ["NEMO_GYM_CONFIG_PATH"]
mark("worker_import", name=name)
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    mark("handler", name=name)
    await asyncio.sleep(0.3)  # the worker's listen and its first answer, apart
    mark("respond", name=name)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
`

type startupServerDef struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Entry string `json:"entry"`
	Exec  bool   `json:"exec"` // bash execs the server in place; else it forks it and waits
}

var startupServers = []startupServerDef{
	{"startup_resources", "resources_servers", "server.py", false},
	{"startup_agent", "responses_api_agents", "server.py", true},
	{"startup_model", "responses_api_models", "uvserver.py", false},
}

type startupMarkLine struct {
	Mark  string `json:"mark"`
	Mono  int64  `json:"mono"`
	PID   int    `json:"pid"`
	Name  string `json:"name"`
	Shell int    `json:"shell"`
}

// startupMarks reads the marks: by "mark/name", every occurrence in order.
func startupMarks(t *testing.T, out string) map[string][]startupMarkLine {
	t.Helper()
	m := map[string][]startupMarkLine{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l startupMarkLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("a mark that is not JSON: %v: %q", err, line)
		}
		k := l.Mark + "/" + l.Name
		m[k] = append(m[k], l)
	}
	return m
}

// monoOffset is realtime minus monotonic, from the narrowest of several
// samples (a preempted sample is wide).
func monoOffset() int64 {
	best, off := int64(math.MaxInt64), int64(0)
	for range 50 {
		var m1, r, m2 unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
		unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2)
		if w := m2.Nano() - m1.Nano(); w < best {
			best, off = w, r.Nano()-(m1.Nano()+m2.Nano())/2
		}
	}
	return off
}

func writeStartupLauncher(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range map[string]string{"gym": startupOrchestrator, "venvstep.py": startupVenv,
		"server.py": startupServer, "uvserver.py": startupUvicorn, "uvapp.py": startupUvApp} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestStartupSpans: gymtrace (discovery, --span-groups startup alone: no HTTP
// group, so every HTTP record is dropped in the kernel) traces a Gym-shaped
// start of three servers: one bash forks, one bash execs in place, one a
// uvicorn server with two workers. A launch finished before gymtrace
// started gets no startup span.
func TestStartupSpans(t *testing.T) {
	needStack(t) // Debian's python3 with uvicorn
	dir := writeStartupLauncher(t)
	servers, _ := json.Marshal(startupServers)
	argv := []string{python, filepath.Join(dir, "gym"), "env", "start"}
	env := []string{"STARTUP_SERVERS=" + string(servers), "PYTHONUNBUFFERED=1"}

	// A start that gymtrace does not see: it has answered before gymtrace runs.
	oldServers, _ := json.Marshal(startupServers[:1])
	old := startProc(t, t, "launcher started before gymtrace", argv, procOpts{Env: []string{"STARTUP_SERVERS=" + string(oldServers)}})
	old.WaitOutput(t, false, `"orch_main"`, 60*time.Second)
	fmt.Fprintln(old.Stdin, "go")
	old.WaitOutput(t, false, `"all_ready"`, 60*time.Second)

	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "startup", out)
	before := monoNow()
	orch := startLaunch(t, g, argv, env)
	// Every span: gym.startup, four per server, one per uvicorn worker. On a
	// shortfall the checks below say which are missing.
	want := float64(1 + 4*len(startupServers) + 2)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if lcBuilt("startup", want)(g.metrics(t)) {
			break
		}
	}
	time.Sleep(300 * time.Millisecond)
	metrics := g.metrics(t)
	t.Run("dashboard", func(t *testing.T) { checkStartupPanel(t, g, metrics) })
	g.shutdown(t)

	marks := startupMarks(t, orch.Stdout.String())
	oldMarks := startupMarks(t, old.Stdout.String())
	off := monoOffset()
	var all []Span
	for _, sp := range readSpans(t, out) {
		if strings.HasPrefix(sp.Name, "gym.startup") || strings.HasPrefix(sp.Name, "gym.server.startup") {
			all = append(all, sp)
		}
	}
	s := newSpanSet(all)
	t.Cleanup(func() {
		if t.Failed() {
			s.dump(t)
			t.Logf("launcher's marks:\n%s", orch.Stdout.String())
			var lines []string
			for _, l := range strings.Split(g.Stderr.String(), "\n") {
				if strings.Contains(l, "startup_") || strings.Contains(l, "orchestrator") {
					lines = append(lines, l)
				}
			}
			t.Logf("gymtrace on the launch's processes:\n%s", strings.Join(lines, "\n"))
		}
	})
	oldPIDs := map[int]bool{old.Pid(): true}
	for _, l := range oldMarks {
		for _, m := range l {
			oldPIDs[m.PID] = true
			if m.Shell != 0 {
				oldPIDs[m.Shell] = true
			}
		}
	}
	for _, sp := range all {
		if oldPIDs[sp.PID()] || oldPIDs[sp.AttrInt("process.pid")] {
			t.Errorf("a startup span for the launch gymtrace did not see start: %s", sp)
		}
	}

	mono := func(sp Span, end bool) int64 {
		if end {
			return int64(sp.End) - off
		}
		return int64(sp.Start) - off
	}
	one := func(k string) startupMarkLine {
		t.Helper()
		if len(marks[k]) == 0 {
			t.Fatalf("the launcher logged no %s", k)
		}
		return marks[k][0]
	}
	slack := int64(startupSlack)
	within := func(what string, v, lo, hi int64) {
		t.Helper()
		if v < lo-slack || v > hi+slack {
			t.Errorf("%s at %+.1f ms, want within [%+.1f, %+.1f] ms (± %v), the marks around it",
				what, float64(v-before)/1e6, float64(lo-before)/1e6, float64(hi-before)/1e6, startupSlack)
		}
	}
	named := func(name string, f func(Span) bool) []Span {
		return s.filter(func(sp Span) bool { return sp.Name == name && (f == nil || f(sp)) })
	}

	// gym.startup: the orchestrator's exec to the last server's answer.
	tops := named("gym.startup", nil)
	if len(tops) != 1 {
		t.Fatalf("%d gym.startup spans, want 1", len(tops))
	}
	top := tops[0]
	if top.Parent != "" || top.PID() != orch.Pid() || top.Res("service.name") != "nemo-gym/orchestrator" {
		t.Errorf("gym.startup: %s, service %q; want a root on the orchestrator (pid %d)", top, top.Res("service.name"), orch.Pid())
	}
	within("gym.startup start (the orchestrator's exec)", mono(top, false), before, one("orch_main/").Mono)
	var lastReady uint64
	var totals []string
	for _, def := range startupServers {
		name := def.Name
		ss := named("gym.startup.server", func(sp Span) bool { return sp.Attr("nemo.gym.server.name") == name })
		if len(ss) != 1 {
			t.Errorf("%s: %d gym.startup.server spans, want 1", name, len(ss))
			continue
		}
		server := ss[0]
		lastReady = max(lastReady, server.End)
		if server.Parent != top.SpanID || server.TraceID != top.TraceID || server.PID() != orch.Pid() ||
			server.Attr("nemo.gym.server.type") != def.Type {
			t.Errorf("%s: %s type %q; want a child of gym.startup on the orchestrator, type %s", name, server, server.Attr("nemo.gym.server.type"), def.Type)
		}
		own := named("gym.server.startup", func(sp Span) bool { return sp.Parent == server.SpanID })
		if len(own) != 1 {
			t.Errorf("%s: %d gym.server.startup under its gym.startup.server, want 1", name, len(own))
			continue
		}
		ps := own[0]
		srvPID := one("server_main/" + name).PID
		if ps.PID() != srvPID || ps.AttrInt("process.pid") != srvPID || ps.Attr("nemo.gym.server.name") != name ||
			ps.Attr("nemo.gym.server.type") != def.Type || ps.Res("service.name") != "nemo-gym/"+name {
			t.Errorf("%s: %s (process.pid %d, service %q); want the server's own, pid %d", name, ps, ps.AttrInt("process.pid"), ps.Res("service.name"), srvPID)
		}
		if shell := one("spawned/" + name).Shell; def.Exec != (srvPID == shell) {
			t.Errorf("%s: server pid %d, launch shell %d: the launch did not run as meant (exec in place: %v)", name, srvPID, shell, def.Exec)
		}
		venv := named("gym.server.startup.venv_setup", func(sp Span) bool { return sp.Parent == ps.SpanID })
		itl := named("gym.server.startup.interpreter_to_listen", func(sp Span) bool { return sp.Parent == ps.SpanID })
		if len(venv) != 1 || len(itl) != 1 {
			t.Errorf("%s: %d venv_setup and %d interpreter_to_listen stages, want one each", name, len(venv), len(itl))
			continue
		}
		v, il := venv[0], itl[0]
		if v.Attr("nemo.gym.startup.stage") != "venv_setup" || il.Attr("nemo.gym.startup.stage") != "interpreter_to_listen" {
			t.Errorf("%s: stage attributes %q, %q", name, v.Attr("nemo.gym.startup.stage"), il.Attr("nemo.gym.startup.stage"))
		}
		// Contiguous, and summing to the server's own span, exactly.
		if v.Start != ps.Start || v.End != il.Start || il.End != ps.End || ps.Start != server.Start || ps.End > server.End ||
			v.Duration()+il.Duration() != ps.Duration() {
			t.Errorf("%s: stages [%d, %d] [%d, %d] are not contiguous over gym.server.startup [%d, %d] (in gym.startup.server [%d, %d])",
				name, v.Start, v.End, il.Start, il.End, ps.Start, ps.End, server.Start, server.End)
		}
		// Each boundary between the marks around it.
		within(name+": the shell's fork", mono(server, false), one("spawn/"+name).Mono, one("spawned/"+name).Mono)
		within(name+": the server's exec", mono(v, true), one("venv_done/"+name).Mono, one("server_main/"+name).Mono)
		within(name+": the ready answer", mono(server, true), one("respond/"+name).Mono, one("probe_ok/"+name).Mono)
		listenLo, listenHi := int64(0), one("probe_ok/"+name).Mono
		if def.Entry == "uvserver.py" {
			// The first listen is a worker's, after it imported the app.
			imports := marks["worker_import/"+name]
			if len(imports) == 0 {
				t.Fatalf("%s: no worker imported the app", name)
			}
			listenLo = imports[0].Mono
			for _, im := range imports {
				listenLo = min(listenLo, im.Mono)
			}
			// A worker reads a request only after it listens.
			listenHi = one("handler/" + name).Mono
			checkStartupWorkers(t, s, ps, imports, one("server_main/"+name).Mono, within, mono)
		} else {
			listenLo, listenHi = one("pre_listen/"+name).Mono, one("post_listen/"+name).Mono
		}
		within(name+": the listen", mono(ps, true), listenLo, listenHi)
		if !(server.Start < v.End && v.End < ps.End && ps.End <= server.End) {
			t.Errorf("%s: fork, exec, listen, answer out of order", name)
		}
		totals = append(totals, fmt.Sprintf("%s: venv_setup %.0f ms, interpreter_to_listen %.0f ms, listen to answer %.0f ms",
			name, startupMs(v.Duration()), startupMs(il.Duration()), startupMs(time.Duration(server.End-ps.End))))
		checkStartupMetrics(t, metrics, name, def.Type, server, v, il)
	}
	if top.End != lastReady {
		t.Errorf("gym.startup ends at %d, want the last server's answer at %d", top.End, lastReady)
	}
	within("gym.startup end", mono(top, true), 0, one("all_ready/").Mono)
	t.Logf("startup: %.0f ms; %s", startupMs(top.Duration()), strings.Join(totals, "; "))
}

// startLaunch starts the launcher once gymtrace runs, holds it until gymtrace
// traces it (so its forks are seen), and waits for its servers to answer.
func startLaunch(t *testing.T, g *gymtrace, argv, env []string) *proc {
	t.Helper()
	orch := startProc(t, t, "launcher", argv, procOpts{Env: env})
	g.WaitOutput(t, true, fmt.Sprintf("msg=tracing pid=%d ", orch.Pid()), 30*time.Second)
	fmt.Fprintln(orch.Stdin, "go")
	orch.WaitOutput(t, false, `"all_ready"`, 120*time.Second)
	return orch
}

// TestStartupGroupOff: with the startup group off (default) the same start
// makes no startup span, and its listen(2) records are dropped in the kernel
// (counted discarded for startup, none emitted).
func TestStartupGroupOff(t *testing.T) {
	needStack(t)
	dir := writeStartupLauncher(t)
	servers, _ := json.Marshal(startupServers)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default", out)
	startLaunch(t, g, []string{python, filepath.Join(dir, "gym"), "env", "start"}, []string{"STARTUP_SERVERS=" + string(servers)})
	// One listen per server that listens itself, one per uvicorn worker.
	const listens = 4
	lcAwait(t, g, "the servers' listen(2) dropped in the kernel", func(m map[string]float64) bool {
		return groupCounters(m, "gymtrace_events_discarded_total")["startup"] >= listens
	})
	m := g.metrics(t)
	g.shutdown(t)
	if n := groupCounters(m, "gymtrace_events_emitted_total")["startup"]; n != 0 {
		t.Errorf("%v startup records emitted with the group off", n)
	}
	for _, sp := range readSpans(t, out) {
		if strings.HasPrefix(sp.Name, "gym.startup") || strings.HasPrefix(sp.Name, "gym.server.startup") {
			t.Errorf("a startup span with the group off: %s", sp)
		}
	}
}

func startupMs(d time.Duration) float64 { return float64(d) / 1e6 }

// checkStartupWorkers: one gym.server.startup.worker per uvicorn worker, from
// its fork (after the main process started) to its listen (after it imported
// the app), on the worker's own pid.
func checkStartupWorkers(t *testing.T, s *spanSet, ps Span, imports []startupMarkLine, mainStart int64,
	within func(string, int64, int64, int64), mono func(Span, bool) int64) {
	t.Helper()
	ws := s.filter(func(sp Span) bool { return sp.Name == "gym.server.startup.worker" && sp.Parent == ps.SpanID })
	if len(ws) != len(imports) {
		t.Errorf("%d gym.server.startup.worker spans, want one per worker (%d)", len(ws), len(imports))
	}
	byPID := map[int]int64{}
	for _, im := range imports {
		byPID[im.PID] = im.Mono
	}
	for _, w := range ws {
		imp, ok := byPID[w.PID()]
		if !ok || w.AttrInt("process.pid") != w.PID() || w.Attr("nemo.gym.startup.stage") != "worker_start" {
			t.Errorf("worker span %s (process.pid %d, stage %q) is no worker's that imported the app", w, w.AttrInt("process.pid"), w.Attr("nemo.gym.startup.stage"))
			continue
		}
		within(fmt.Sprintf("worker %d's fork", w.PID()), mono(w, false), mainStart, imp)
		if mono(w, true) < imp-int64(startupSlack) {
			t.Errorf("worker %d listens before it imported the app", w.PID())
		}
	}
}

// checkStartupMetrics: one observation per server of spawn-to-ready (on the
// orchestrator's series) and of each stage (on the server's), equal to the
// spans' durations.
func checkStartupMetrics(t *testing.T, m map[string]float64, name, typ string, server, venv, itl Span) {
	t.Helper()
	find := func(family string, labels ...string) (float64, float64, bool) { return histFind(m, family, labels...) }
	nl := `nemo_gym_server_name="` + name + `"`
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.01 }
	if c, sum, ok := find("gym_server_startup_duration_ms_milliseconds", nl, `nemo_gym_server_type="`+typ+`"`); !ok || c != 1 || !near(sum, startupMs(server.Duration())) {
		t.Errorf("%s: gym.server.startup_duration_ms count %v sum %v (found %v), want 1 of %.3f ms", name, c, sum, ok, startupMs(server.Duration()))
	}
	for stage, sp := range map[string]Span{"venv_setup": venv, "interpreter_to_listen": itl} {
		c, sum, ok := find("gym_server_startup_stage_duration_ms_milliseconds", nl, `nemo_gym_startup_stage="`+stage+`"`)
		if !ok || c != 1 || !near(sum, startupMs(sp.Duration())) {
			t.Errorf("%s: gym.server.startup.stage_duration_ms{%s} count %v sum %v (found %v), want 1 of %.3f ms", name, stage, c, sum, ok, startupMs(sp.Duration()))
		}
	}
}

// histFind sums the count and sum series of histogram family (its Prometheus
// name) whose labels include every one of labels (`key="value"`).
func histFind(m map[string]float64, family string, labels ...string) (count, sum float64, found bool) {
	for k, v := range m {
		if !strings.HasPrefix(k, family+"_count{") && !strings.HasPrefix(k, family+"_sum{") {
			continue
		}
		if slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(k, l) }) {
			continue
		}
		found = true
		if strings.HasPrefix(k, family+"_count{") {
			count += v
		} else {
			sum += v
		}
	}
	return count, sum, found
}

// checkStartupPanel evaluates the dashboard's "Server startup by stage"
// queries (deploy/grafana) against Debian's Prometheus scraping this
// gymtrace: a series per server (and stage) of this launch, each the mean
// gymtrace's own /metrics gives. TestDashboard's stack starts before its
// gymtrace, so this is where those queries meet a start gymtrace saw.
func checkStartupPanel(t *testing.T, g *gymtrace, m map[string]float64) {
	bin := needPrometheus(t)
	var targets []dashTarget
	for _, tg := range dashboardTargets(t) {
		if strings.Contains(tg.Expr, "gym_server_startup") {
			targets = append(targets, tg)
		}
	}
	if len(targets) == 0 {
		t.Fatal("the dashboard has no query of gym.server.startup.*")
	}
	prom := startPrometheus(t, bin, g.metricsAddr)
	mine := func(s promSample) bool {
		return slices.ContainsFunc(startupServers, func(d startupServerDef) bool { return d.Name == s.Labels["nemo_gym_server_name"] })
	}
	for _, tg := range targets {
		expr := grafanaVars(t, tg.Expr, 2*time.Minute, 10*time.Minute)
		var got []promSample
		waitFor(t, 60*time.Second, "prometheus to scrape every server's startup for "+tg.Panel+"/"+tg.RefID, func() bool {
			s, err := prom.query(expr, time.Now())
			if err != nil {
				t.Fatalf("%s: %v", expr, err)
			}
			got = slices.DeleteFunc(s, func(s promSample) bool { return !mine(s) })
			return len(got) >= len(startupServers)
		})
		for _, s := range got {
			labels := []string{`nemo_gym_server_name="` + s.Labels["nemo_gym_server_name"] + `"`}
			family := "gym_server_startup_duration_ms_milliseconds"
			if st, ok := s.Labels["nemo_gym_startup_stage"]; ok {
				labels = append(labels, `nemo_gym_startup_stage="`+st+`"`)
				family = "gym_server_startup_stage_duration_ms_milliseconds"
			}
			c, sum, ok := histFind(m, family, labels...)
			if !ok || c == 0 || math.Abs(s.Value-sum/c) > 1e-6*math.Max(1, sum/c) {
				t.Errorf("%s: %v = %v, want gymtrace's mean %v (count %v)", tg.Panel+"/"+tg.RefID, s.Labels, s.Value, sum/c, c)
			}
		}
		t.Logf("%s/%s: %d series of this launch", tg.Panel, tg.RefID, len(got))
	}
}
