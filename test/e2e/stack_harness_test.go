//go:build linux

package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// --- the Gym-shaped stack (test/stack) ----------------------------------------

type stackServer struct {
	Name string `json:"name"`
	Type string `json:"type"`
	PID  int    `json:"pid"`
	Host string `json:"host"`
	Port int    `json:"port"`
	URL  string `json:"url"`
}

type stackReady struct {
	Event         string                 `json:"event"`
	Error         string                 `json:"error"`
	Host          string                 `json:"host"`
	LogDir        string                 `json:"log_dir"`
	Servers       map[string]stackServer `json:"servers"`
	CollectorArgv []string               `json:"collector_argv"`
	LauncherPID   int                    `json:"launcher_pid"` // launch.py, or ng_run with --exec-ng-run
}

type stack struct {
	*proc
	ready stackReady
}

// stackStartTimeout bounds launch.py's ready line: its servers' own bound
// (--startup-timeout, 5 min), and the warmup.
const stackStartTimeout = 7 * time.Minute

// startStack runs launch.py --serve --warmup 2: the servers are up and their
// pooled keep-alive connections exist before any gymtrace attaches.
func startStack(t testing.TB, own owner, args ...string) *stack {
	t.Helper()
	argv := append([]string{python, filepath.Join(repoRoot, "test", "stack", "launch.py"), "--serve", "--warmup", "2"}, args...)
	s := &stack{proc: startProc(t, own, "stack", argv, procOpts{Dir: repoRoot})}
	// A bound on failure (launch.py fails a server that exits at once, and
	// one that does not answer in --startup-timeout, 5 min): beside the
	// kernel matrix's guests a server took over 30 s to answer.
	began := time.Now()
	line := s.FirstLine(t, stackStartTimeout)
	if took := time.Since(began); took > 30*time.Second {
		t.Logf("the stack took %.1fs to start (a busy machine?)", took.Seconds())
	}
	if err := json.Unmarshal([]byte(line), &s.ready); err != nil {
		t.Fatalf("launch.py's first line is not JSON: %v: %s", err, line)
	}
	if s.ready.Event != "ready" {
		t.Fatalf("the stack did not start: %s; stderr:\n%s", line, tail(s.Stderr.String(), 4096))
	}
	for _, k := range []string{"agent", "model", "resources"} {
		if s.ready.Servers[k].PID == 0 {
			t.Fatalf("launch.py's ready line has no %s server: %s", k, line)
		}
	}
	return s
}

var shared struct {
	once sync.Once
	st   *stack
}

// sharedStack is one IPv4 stack for every test that only needs traffic: each
// test attaches its own gymtrace to it, so the stack's connections always
// predate the tracer, as in production.
func sharedStack(t *testing.T) *stack {
	t.Helper()
	needStack(t)
	shared.once.Do(func() { shared.st = startStack(t, sharedOwner{}) })
	if shared.st == nil {
		t.Fatal("the shared stack failed to start (see the first test that used it)")
	}
	if shared.st.Exited() {
		t.Fatalf("the shared stack died: %v; stderr:\n%s", shared.st.Err, tail(shared.st.Stderr.String(), 4096))
	}
	return shared.st
}

func (s *stack) server(role string) stackServer { return s.ready.Servers[role] }

func (s *stack) pids() []int {
	return []int{s.server("agent").PID, s.server("model").PID, s.server("resources").PID}
}

type summary struct {
	Event      string   `json:"event"`
	Rollouts   int      `json:"rollouts"`
	OK         int      `json:"ok"`
	Failed     int      `json:"failed"`
	RewardMean float64  `json:"reward_mean"`
	RolloutIDs []string `json:"rollout_ids"`
	Errors     []any    `json:"errors"`
}

// collect runs one collection (collector_argv + --rollouts n --concurrency c
// + extra) against the running stack. The collector is not traced.
func (s *stack) collect(t testing.TB, n, c int, wantOK bool, extra ...string) summary {
	t.Helper()
	argv := append(append([]string{}, s.ready.CollectorArgv...), "--rollouts", strconv.Itoa(n), "--concurrency", strconv.Itoa(c))
	argv = append(argv, extra...)
	ctx, cancel := withTimeout(120 * time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = repoRoot
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr syncBuf
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var sum summary
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"summary"`) {
			if jerr := json.Unmarshal([]byte(line), &sum); jerr != nil {
				t.Fatalf("collector summary is not JSON: %v: %s", jerr, line)
			}
		}
	}
	if sum.Event != "summary" {
		t.Fatalf("collector %v printed no summary (%v); stdout:\n%s\nstderr:\n%s", argv, err, out, tail(stderr.String(), 4096))
	}
	if wantOK && (err != nil || sum.OK != n) {
		t.Fatalf("collector: %d of %d rollouts ok (%v), errors %v; stderr:\n%s", sum.OK, n, err, sum.Errors, tail(stderr.String(), 4096))
	}
	return sum
}

// --- what one rollout does -------------------------------------------------------

// One rollout at the stack's defaults (--turns 2, model route responses, no
// prefix), by process: the agent serves /run and its own /v1/responses and
// makes 8 calls (seed_session, self /v1/responses, 2 x (model, get_weather),
// gather(verify, get_weather)); the model serves 2 calls; resources 5.
type stackCall struct {
	role   string   // process: agent, model, resources
	server bool     // the process serves it (else the process makes the call)
	name   string   // SERVER span name, or "HTTP POST"
	gym    string   // gym.* span under the SERVER span, "" when none
	groups []string // the kernel's group bits for this message
	n      int      // per rollout
}

var rolloutCalls = []stackCall{
	{"agent", true, "POST /run", "gym.rollout", []string{"server", "rollout"}, 1},
	{"agent", true, "POST /v1/responses", "gym.agent.responses", []string{"server", "agent"}, 1},
	{"agent", false, "HTTP POST", "", []string{"http_client"}, 8},
	{"model", true, "POST /v1/responses", "gym.model.responses", []string{"server", "model_call"}, 2},
	{"resources", true, "POST /seed_session", "", []string{"server"}, 1},
	{"resources", true, "POST /get_weather", "", []string{"server"}, 3},
	{"resources", true, "POST /verify", "gym.verify", []string{"server", "verify"}, 1},
}

// The gate's first test per process and direction (groups.ServerPossible and
// ClientPossible): when none of these is enabled, the kernel returns before it
// counts anything.
var serverPossible = map[string][]string{
	"agent":     {"server", "rollout", "agent"},
	"model":     {"server", "model_call"},
	"resources": {"server", "verify"},
}

var gymGroup = map[string]string{
	"gym.rollout": "rollout", "gym.agent.responses": "agent", "gym.model.responses": "model_call", "gym.verify": "verify",
}

type groupSet map[string]bool

func newGroupSet(names ...string) groupSet {
	g := groupSet{}
	for _, n := range names {
		g[n] = true
	}
	return g
}

func (g groupSet) any(names []string) bool {
	for _, n := range names {
		if g[n] {
			return true
		}
	}
	return false
}

// allGroups are the groups the metrics report.
var allGroups = []string{"job", "server", "http_client", "rollout", "agent", "model_call", "verify", "sandbox", "checkpoint", "step", "optimizer"}

// expectedCounters is what the kernel must count for n rollouts: at each
// request start, every group bit of the message is counted as emitted when
// enabled and discarded when not, unless the process/direction gate returned
// first (no enabled group possible there: nothing read, nothing counted).
func expectedCounters(enabled groupSet, n int) (emitted, discarded map[string]float64) {
	emitted, discarded = map[string]float64{}, map[string]float64{}
	for _, g := range allGroups {
		emitted[g], discarded[g] = 0, 0
	}
	for _, c := range rolloutCalls {
		possible := []string{"http_client"}
		if c.server {
			possible = serverPossible[c.role]
		}
		if !enabled.any(possible) {
			continue
		}
		for _, g := range c.groups {
			if enabled[g] {
				emitted[g] += float64(c.n * n)
			} else {
				discarded[g] += float64(c.n * n)
			}
		}
	}
	return emitted, discarded
}

func expectedSpanCount(enabled groupSet, n int) int {
	total := 0
	for _, c := range rolloutCalls {
		if c.server && enabled["server"] || !c.server && enabled["http_client"] {
			total += c.n * n
		}
		if c.gym != "" && enabled[gymGroup[c.gym]] {
			total += c.n * n
		}
	}
	return total
}
