//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// kmTwoNodeFeature is the feature table's row for the job's twonode phase.
const kmTwoNodeFeature = "two nodes"

// kmTwoNodeCount is what test/inject TestTwoNodesNewConnections kept
// (GYMTRACE_TWONODE_OUT).
type kmTwoNodeCount struct {
	Rollouts, Concurrency, Runs       int
	RemoteServer                      int `json:"remote_server"`
	Joined                            int
	UnderRun                          int `json:"under_run"`
	Complete                          int
	Connections                       int
	FirstJoined                       int `json:"first_joined"`
	ConnectionsShared                 int `json:"connections_shared"`
	Injected, Sockets, Miss, PushFail float64
	Forced                            bool
	InjectEnabled                     []string `json:"inject_enabled"`
}

var kmConformanceRe = regexp.MustCompile(`conformance: (\d+) of (\d+) checks the same untraced and traced, injection as gymtrace decided: (\w+)`)

// kmTwoNode judges the twonode phase (scripts/kernel-matrix-guest): two
// network namespaces, one gymtrace each, a new connection per rollout on
// uvloop and httptools, then test/conformance. Where the job was not asked
// to run it, or injection is off on the kernel (the job says why), the row
// is "not run"; a skip where injection is expected on fails. Where it ran,
// the counts are asserted here again: every model/resources request's span
// under the exported agent CLIENT span its traceparent names (the first of
// each connection included, no connection shared by two rollouts),
// every rollout whole, injection on without forcing, and every socket
// check the same traced and untraced.
func kmTwoNode(t *testing.T, dir string, phases []string, check, release string, k *kmKernel) {
	set := func(f kmFeature) { k.Features[kmTwoNodeFeature] = f }
	if !slices.Contains(phases, "twonode") {
		set(kmFeature{NotRun: fmt.Sprintf("the job was not asked to (phases %s)", strings.Join(phases, ","))})
		return
	}
	tn := filepath.Join(dir, "twonode")
	if b, err := os.ReadFile(filepath.Join(tn, "skipped")); err == nil {
		why := strings.TrimSpace(string(b))
		injOff := (strings.Contains(check, "lacks bpf_get_current_pid_tgid in sock_ops") && kmBefore(release, 6, 10)) ||
			regexp.MustCompile(`(?m)^injection self-test \(sockhash\)\s+missing .*FIONREAD`).MatchString(check)
		if !injOff {
			t.Errorf("two nodes: the job did not run it (%s), but injection is expected on on Linux %s", why, release)
		}
		set(kmFeature{NotRun: why})
		t.Logf("two nodes: not run: %s", why)
		return
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(tn, name))
		if err != nil {
			t.Errorf("two nodes: %v (did the phase run?)", err)
		}
		return string(b)
	}
	var c kmTwoNodeCount
	if js := read("twonode.json"); js != "" {
		if err := json.Unmarshal([]byte(js), &c); err != nil {
			t.Errorf("two nodes: twonode.json: %v", err)
		}
	}
	injectTxt, confTxt := read("inject.txt"), read("conformance.txt")
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if !strings.Contains(injectTxt, "--- PASS: TestTwoNodesNewConnections") {
		fail("TestTwoNodesNewConnections did not pass (twonode/inject.txt)")
	}
	if c.Rollouts == 0 || c.RemoteServer != 7*c.Rollouts || c.Joined != c.RemoteServer || c.UnderRun != c.RemoteServer {
		fail("%d of %d remote requests' spans under an agent CLIENT span (%d under their /run; want %d)",
			c.Joined, c.RemoteServer, c.UnderRun, 7*c.Rollouts)
	}
	if c.Runs != c.Rollouts || c.Complete != c.Rollouts {
		fail("%d of %d rollouts whole (%d /run spans)", c.Complete, c.Rollouts, c.Runs)
	}
	if c.Connections < 2*c.Rollouts || c.FirstJoined != c.Connections || c.ConnectionsShared != 0 {
		fail("%d connections (want at least %d), %d with their first request joined, %d serving two rollouts",
			c.Connections, 2*c.Rollouts, c.FirstJoined, c.ConnectionsShared)
	}
	if c.Forced || len(c.InjectEnabled) != 2 || slices.ContainsFunc(c.InjectEnabled, func(s string) bool { return s != `inject_enabled{reason=""} 1` }) {
		fail("injection not on as gymtrace decides it in both gymtraces: forced=%v, %v", c.Forced, c.InjectEnabled)
	}
	if c.PushFail != 0 {
		fail("%.0f failed pushes", c.PushFail)
	}
	conf := "no conformance result"
	if m := kmConformanceRe.FindStringSubmatch(confTxt); m == nil || !strings.Contains(confTxt, "--- PASS: TestSocketSemantics") {
		fail("TestSocketSemantics did not pass (twonode/conformance.txt)")
	} else {
		same, total := kmAtoi(m[1]), kmAtoi(m[2])
		conf = fmt.Sprintf("%d of %d socket checks the same traced (injection %s) and untraced", same, total, m[3])
		if same != total || total < 15 || m[3] != "on" {
			fail("%s", conf)
		}
	}
	took := strings.TrimSpace(read("took"))
	ev := fmt.Sprintf("%d rollouts at concurrency %d, a new connection pool each: %d of %d remote requests under the exported agent "+
		"CLIENT span their traceparent names (%d connections, %d with the first request joined, %d shared by two rollouts); "+
		"%d of %d rollouts whole; %.0f traceparents injected; %s; %s", c.Rollouts, c.Concurrency, c.Joined, c.RemoteServer,
		c.Connections, c.FirstJoined, c.ConnectionsShared, c.Complete, c.Rollouts, c.Injected, conf, took)
	for _, b := range bad {
		t.Errorf("two nodes: %s", b)
	}
	set(kmFeature{On: len(bad) == 0, Evidence: ev})
	t.Logf("two nodes: %s", ev)
}

func kmAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
